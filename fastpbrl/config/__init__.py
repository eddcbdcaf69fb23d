"""A run's settings and their checks (``settings``)."""

from fastpbrl.core.imports import lazy_names

# ``from fastpbrl.config import RunConfig, ConfigError``, as before.
__getattr__ = lazy_names(__name__, {'RunConfig': 'settings',
                                    'ConfigError': 'settings'})
