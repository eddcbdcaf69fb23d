"""HyperTrick's host-side half: its run settings and driver (not jittable).

The scheduler (phases, quantile eviction) and the pure slot reset are
``fastpbrl.population.hypertrick`` (the paper and the departures are in that
module's docstring). Here: ``HyperTrickRunConfig`` (the ``fastpbrl
hypertrick`` flags) and ``HyperTrickDriver`` (which slots finished a phase,
their reports, restarting evicted slots with fresh replay).
"""

from __future__ import annotations

import base64
import dataclasses
import pickle
from typing import Optional

import jax
import numpy as np

from fastpbrl.population import hypertrick as hypertrick_lib
from fastpbrl.population import search_space as ss
from fastpbrl.rules.common import (FreshEpisodes, _check_evaluations_per,
                                   _search_space, _validate_space)
from fastpbrl.run import (Driver, Loop, RunConfig, _check, as_flag_error,
                          hparam_rows)


@dataclasses.dataclass
class HyperTrickRunConfig(RunConfig):
  """HyperTrick (Heinrich & Frosio): phases with early termination."""

  num_workers: int = 8
  """Configurations to try in total (each runs in a population slot)."""
  num_phases: int = 4
  """Phases per configuration; a configuration reports at each phase's end."""
  phase_update_steps: int = 2_500
  """Update steps per phase; a phase must hold an evaluation (--eval-every)."""
  eval_every: int = 1_000
  """Env steps per member between evaluations (no-noise episodes)."""
  eviction_rate: float = 0.25
  """Target fraction of the configurations in a phase terminated at its end."""
  quantile: float = 0.5
  """A late reporter below this quantile of its phase's metrics is terminated."""
  init_hparams: str = 'prior'
  """Hyperparameters of every configuration: prior (sampled) or defaults."""
  search_space: Optional[str] = None
  """A JSON (or YAML) file of the prior the configurations are sampled from
  (format: README, "Search space from a file"); default: the agent's
  registered space."""


class HyperTrickDriver(Driver):
  """Independent members; slots report per phase, losers restart afresh."""

  name = 'hypertrick'

  def __init__(self, config: HyperTrickRunConfig,
               space: Optional[ss.SearchSpace] = None):
    super().__init__(config)
    _check(config.phase_update_steps >= 1, '--phase-update-steps must be >= 1')
    _check_evaluations_per(config.phase_update_steps, config,
                           '--phase-update-steps')
    _check(config.init_hparams in ('prior', 'defaults'),
           f'--init-hparams must be prior or defaults, got {config.init_hparams!r}')
    try:
      self.ht_config = hypertrick_lib.HyperTrickConfig(
          num_workers=config.num_workers, num_phases=config.num_phases,
          eviction_rate=config.eviction_rate, quantile=config.quantile)
    except ValueError as e:
      raise as_flag_error(e, config) from None
    self.space = space or _search_space(config)
    self.scheduler = hypertrick_lib.HyperTrick(self.ht_config,
                                               config.population_size)
    self.rng = np.random.default_rng(config.seed)
    n = config.population_size
    self.phase_start = np.zeros((n,), np.int64)
    self.phase_returns = [[] for _ in range(n)]
    self._reset = None
    self.fresh = FreshEpisodes(n)

  def initial_hparams(self, key, agent, population_size):
    defaults = agent.default_hparams()
    _validate_space(self.config, self.space, defaults)
    if self.config.init_hparams == 'defaults':
      hparams = super().initial_hparams(key, agent, population_size)
    else:
      hparams = ss.sample(key, self.space, defaults, population_size)
    rows = hparam_rows(hparams)
    for slot, worker in enumerate(self.scheduler.start()):
      if worker is not None:
        self.scheduler.set_hparams(worker, rows[slot])
    return hparams

  def _reset_fn(self, loop: Loop):
    if self._reset is None:
      space = self.space if self.config.init_hparams == 'prior' else None
      template = loop.agent.default_hparams()
      self._reset = jax.jit(lambda key, state, hparams, reset:
                            hypertrick_lib.reset_members(
                                key, state, hparams, reset, loop.agent.init,
                                space, template))
    return self._reset

  def after_call(self, loop: Loop) -> None:
    for r in loop.episodes:
      if r['evaluation'] and self.fresh.keep(r):
        self.phase_returns[int(r['member'])].append(float(r['episode_return']))
    # A phase counts the slot's own update steps: a restarted slot takes
    # none while it warms up.
    due = [slot for slot in range(len(self.phase_start))
           if self.scheduler.slot_worker[slot] is not None
           and loop.member_update_steps[slot] - self.phase_start[slot]
           >= self.config.phase_update_steps]
    if not due:
      return
    # Slots finish phases together here; report in a random order, as the
    # asynchronous workers of the paper would arrive.
    reset = np.zeros((len(self.phase_start),), bool)
    # Departure from the paper, whose budget is a number of workers: ours is
    # also env steps per member, and a new experiment started when the
    # budget left cannot hold its warm-up and one phase is evaluated
    # untrained at the end (on HalfCheetah-v5 every slot completed its last
    # phase on the budget's last call and was restarted just before the
    # final evaluation). Such a slot keeps its worker and goes on training.
    left = self.config.env_steps - loop.env_steps
    launch = left >= (self.config.warmup_steps
                      + self.config.phase_update_steps
                      / self.config.update_to_data_ratio)
    for slot in self.rng.permutation(due):
      returns = self.phase_returns[slot][-10:]
      metric = float(np.mean(returns)) if returns else -np.inf
      report = self.scheduler.report(int(slot), metric, launch=launch)
      self.phase_start[slot] = loop.member_update_steps[slot]
      self.phase_returns[slot] = []
      if report.new_worker is not None:
        reset[slot] = True
    if reset.any():
      loop.state, loop.hparams = self._reset_fn(loop)(
          loop.next_key(), loop.state, loop.hparams, reset)
      # A new experiment from phase one: an empty replay and its own
      # warm-up (the evicted configuration's data is not reused).
      loop.pipeline.restart_members(np.flatnonzero(reset))
      self.fresh.renew(loop, reset)
      rows = hparam_rows(loop.hparams)
      for slot in np.flatnonzero(reset):
        self.scheduler.set_hparams(self.scheduler.slot_worker[slot], rows[slot])
      self.emit([{'event': 'reset', 'step': loop.update_steps,
                  'env_steps': loop.env_steps, 'member': int(slot),
                  'hparams': rows[slot]} for slot in np.flatnonzero(reset)])

  def finished(self, loop: Loop) -> bool:
    return self.scheduler.done or super().finished(loop)

  def scalars(self) -> dict:
    return {'workers_launched': self.scheduler.launched}

  def checkpoint_arrays(self):
    return {'phase_start': self.phase_start}

  def checkpoint_meta(self) -> dict:
    return {'scheduler': base64.b64encode(pickle.dumps(
        self.scheduler)).decode('ascii'),
            'rng': self.rng.bit_generator.state,
            'phase_returns': self.phase_returns}

  def restore(self, arrays, meta) -> None:
    self.phase_start = np.asarray(arrays['phase_start'], np.int64)
    self.scheduler = pickle.loads(base64.b64decode(meta['scheduler']))  # noqa: S301 (our own checkpoint)
    self.rng.bit_generator.state = meta['rng']
    self.phase_returns = meta['phase_returns']
    self.fresh.restart()

  def summary(self, loop: Loop) -> str:
    del loop
    try:
      best = self.scheduler.best()
    except ValueError:
      return 'HyperTrick: no configuration finished a phase'
    rates = ', '.join(f'{r:.2f}' for r in self.scheduler.eviction_rates())
    return (f'HyperTrick: {self.scheduler.launched} configurations launched; '
            f'eviction rate per phase [{rates}] (target '
            f'{self.ht_config.eviction_rate}); best: configuration '
            f'{best.worker}, mean evaluation return {best.metric:.1f} at the '
            f'end of phase {best.phase}, hyperparameters {best.hparams}')
