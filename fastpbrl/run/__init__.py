"""A run and its loop: ``run(config, rule)`` (``main``) opens what a run
needs and hands it to the training loop (``loop``); a run is built from its
settings (``build``), checkpointed and resumed (``checkpoint``, ``resume``),
ended with a final evaluation, summary and pictures (``finish``,
``plots``), and stopped cleanly by signals (``signals``); ``callbacks`` are
the user's hooks into the loop."""

from fastpbrl.core.imports import lazy_names

# ``fastpbrl.run.run(config, rule)``, imported on first use.
__getattr__ = lazy_names(__name__, {'run': 'main'})
