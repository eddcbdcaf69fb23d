"""Actor processes stepping environments on CPU."""
