"""Experiment scripts: ``python -m experiments.<pbt|cemrl|dvd|hypertrick>``."""
