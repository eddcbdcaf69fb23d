"""Benchmarks of fastpbrl (not part of the installed package)."""
