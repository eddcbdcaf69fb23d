"""Aliases of the installed ``fastpbrl`` command's sub-commands:
``python -m experiments.<pbt|cemrl|dvd|hypertrick|seeds>`` equals
``fastpbrl <pbt|cemrl|dvd|hypertrick|seeds>`` (``fastpbrl/commands/``)."""
