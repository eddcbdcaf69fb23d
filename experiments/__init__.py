"""Aliases of the installed ``fastpbrl`` command's sub-commands:
``python -m experiments.<pbt|cemrl|dvd|hypertrick|seeds|random>`` equals
``fastpbrl <pbt|cemrl|dvd|hypertrick|seeds|random>`` (``fastpbrl/cli/commands/``)."""
