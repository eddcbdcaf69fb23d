"""The population learner: every member's update steps stacked into one
compiled call (``population``)."""
