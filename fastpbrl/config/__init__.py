"""A run's settings and their checks, one module per job (host-side).

* ``fields``: ``RunConfig``, the settings every rule shares (each rule's
  config subclasses it), and ``Derived``; the flags and their ``--help``
  come from its fields and their docstrings;
* ``bounds``: a field's declared range (``bounded``) and ``check_bounds``;
* ``errors``: ``ConfigError``, ``SettingTypeError``, ``StorageError`` and
  ``check``;
* ``agent_settings``: the agent ``--agent`` names and its static config
  (``agent_config``, the ``--agent-settings`` parser);
* ``derived``: settings as a run uses them (``resolved``, intervals in
  update steps and learner calls);
* ``checks``: ``validate`` (with the on-policy refusals) and
  ``check_types``;
* ``saved``: a run's ``config.json``, ``--resume`` and ``--config`` files.

Its public names are imported on first use (PEP 562):
``from fastpbrl.config import RunConfig, ConfigError``, and what a rule of
one's own uses (``examples/halving.py``).
"""

from fastpbrl.core.imports import lazy_names

# name -> the module of this package that defines it.
_NAMES = {'ConfigError': 'errors', 'RunConfig': 'fields',
          'SettingTypeError': 'errors', 'bounded': 'bounds', 'check': 'errors',
          'check_bounds': 'bounds', 'rule_fields': 'fields'}

__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)
