"""Compatibility module: the drivers now live in ``fastpbrl.rules``, one
module per rule beside its pure half in ``fastpbrl.population``.

Every name this module defined is re-exported from its new home, so that
``from fastpbrl.drivers import PBTDriver`` (and the private helpers tests
use) keep working. New code imports from ``fastpbrl.rules.<rule>``.
"""

# Names outside __all__ (as before the move) are re-exported too.
# ruff: noqa: F401
from fastpbrl.rules.cemrl import CEMRLDriver, CEMRLRunConfig
from fastpbrl.rules.common import (FreshEpisodes, _check_evaluations_per,
                                   _check_shared_critic, _search_space,
                                   _validate_space)
from fastpbrl.rules.dvd import (_DIVERSITY_EVERY, DvDDriver, DvDRunConfig,
                                _probe_states)
from fastpbrl.rules.hypertrick import HyperTrickDriver, HyperTrickRunConfig
from fastpbrl.rules.pbt import PBTDriver, PBTRunConfig, ScheduleDriver
from fastpbrl.rules.seeds import SeedsDriver

__all__ = ['CEMRLDriver', 'CEMRLRunConfig', 'DvDDriver', 'DvDRunConfig', 'HyperTrickDriver',
           'HyperTrickRunConfig', 'PBTDriver', 'PBTRunConfig', 'ScheduleDriver']
