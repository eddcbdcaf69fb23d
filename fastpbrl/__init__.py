"""fastpbrl: population-based reinforcement learning on a single machine."""

__version__ = '0.1.0'
