"""Examples of fastpbrl used from user code (``--agent examples.ddpg:DDPG``,
``--search-space examples/search_space.json``)."""
