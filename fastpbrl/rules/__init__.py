"""Drivers: the host-side half of each population rule (not jittable).

A driver tells ``fastpbrl.run.run`` which learner mode to use and what to do
between learner calls; the arithmetic of each rule is a pure function in
``fastpbrl.population`` that the driver calls on the stacked state. Drivers
keep only bookkeeping (fitness histories, counters, lineage files) and hand
all of it to the checkpoint, so that ``--resume`` continues a rule exactly
where it was.

One module per rule, each holding that rule's run settings (the
``RunConfig`` subclass its command parses) and its driver:

* ``seeds``: ``SeedsDriver``, N independent seeds (no rule);
* ``pbt``: ``PBTRunConfig``, ``PBTDriver``, ``ScheduleDriver``;
* ``dvd``: ``DvDRunConfig``, ``DvDDriver``;
* ``hypertrick``: ``HyperTrickRunConfig``, ``HyperTrickDriver``;
* ``cemrl``: ``CEMRLRunConfig``, ``CEMRLDriver``;
* ``common``: what several drivers share (search space loading,
  ``FreshEpisodes``, config checks).

Why a package of its own rather than the bottom of each
``fastpbrl/population/<rule>.py``: a driver subclasses ``fastpbrl.run.Driver``
and reads the run loop's state, so it imports ``fastpbrl.run`` (and through
it the learner, actors, replay and checkpointing); ``fastpbrl.population``
stays pure array functions, importable and testable without the run loop,
as the style guide keeps jitted code apart from host-side code.
``rules/pbt.py`` sits by name beside ``population/pbt.py``: the two halves
of one rule. ``fastpbrl.drivers`` re-exports every name for older imports.
"""

from fastpbrl.rules import cemrl, common, dvd, hypertrick, pbt, seeds

__all__ = ['cemrl', 'common', 'dvd', 'hypertrick', 'pbt', 'seeds']
