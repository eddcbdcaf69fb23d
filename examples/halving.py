"""Successive halving with restarts: a population rule written outside the
package, in one file (the contract: ``fastpbrl/rules/base.py``).

Members start with hyperparameters drawn from the agent's search space.
At the end of every rung (``--rung-update-steps`` of each member's own
update steps), the members whose mean evaluation return over the rung is
in the bottom ``--fraction`` are restarted as new experiments: fresh
weights, an empty replay and its warm-up, and new hyperparameters from the
search space. The others go on. It is the elimination step of successive
halving (Jamieson & Talwalkar 2016) on a fixed number of slots, where an
eliminated configuration's slot is handed to a new random one.

    fastpbrl examples.halving:Halving --help
    fastpbrl examples.halving:Halving --env Pendulum-v1 --env-steps 20000
    fastpbrl examples.halving:Halving --resume runs/halving-td3-...

or ``fastpbrl.train('examples.halving:Halving', env_steps=20_000)``.
The module must be importable by that name (run from the repository's
root, or put its folder on ``PYTHONPATH``): a resume imports it again.
"""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl import agents, rules
from fastpbrl.config import RunConfig, bounded, check, check_bounds, rule_fields
from fastpbrl.core import search_space as ss
from fastpbrl.rules.common import evaluation_returns


@dataclasses.dataclass
class HalvingConfig(RunConfig):
  """Successive halving with restarts."""

  rung_update_steps: int = bounded(2_500, ge=1)
  """Update steps of a member's own in one rung; each rung must hold the
  start of an evaluation (see --eval-every)."""
  fraction: float = bounded(0.5, gt=0, le=0.5)
  """Bottom fraction of the population restarted at the end of a rung."""
  eval_every: int = 1_000
  """Env steps per member between evaluations (their returns score a rung)."""


class HalvingState(NamedTuple):
  key: jax.Array
  rung_start: np.ndarray  # [N] int64: member update steps at its rung start
  returns: np.ndarray  # [N] float64: sum of this rung's evaluation returns
  counts: np.ndarray  # [N] int64: evaluations in this rung
  restarts: np.ndarray  # () int64: members restarted so far


@rules.register
class Halving(rules.Rule):
  name = 'halving'
  help = 'successive halving with restarts (examples/halving.py)'
  config_class = HalvingConfig
  presets = {'small': HalvingConfig(population_size=4, env_steps=20_000)}
  min_population = 2

  def __init__(self, config: HalvingConfig):
    super().__init__(config)
    check_bounds(config, rule_fields(config))  # the bounds declared above
    check(config.eval_every * config.update_to_data_ratio
          <= config.rung_update_steps,
          f'--eval-every {config.eval_every} is longer than a rung: rungs '
          'would end without an evaluation to score them')
    self.space = agents.get(config.agent).default_search_space
    self.defaults = None

  def prepare(self, agent):
    self.defaults = agent.default_hparams()

  def initial_hparams(self, key, agent, population_size):
    return ss.sample(key, self.space, agent.default_hparams(), population_size)

  def init(self, key, population):
    n = self.config.population_size
    return HalvingState(key, np.zeros(n, np.int64), np.zeros(n),
                        np.zeros(n, np.int64),
                        np.asarray(0, np.int64)), population.state

  def decide(self, rule_state, obs):
    returns, counts = rule_state.returns.copy(), rule_state.counts.copy()
    n = self.config.population_size
    for member, values in enumerate(evaluation_returns(obs.episodes, n)):
      for value in values:
        returns[member] += value
        counts[member] += 1
    rule_state = rule_state._replace(returns=returns, counts=counts)
    rung = obs.member_update_steps - rule_state.rung_start
    if (rung < self.config.rung_update_steps).any() or (counts == 0).any():
      return rule_state, rules.Decision()
    # Every member finished its rung: restart the bottom fraction.
    scores = returns / counts
    worst = np.argsort(scores, kind='stable')[:int(self.config.fraction * n)]
    restart = rules.mask(worst, n)
    rule_state, k_hparams = rules.split_key(rule_state)
    rule_state, k_weights = rules.split_key(rule_state)
    drawn = ss.sample(k_hparams, self.space, self.defaults, n)
    hparams = jax.tree.map(lambda new, old: jnp.where(restart, new, old),
                           drawn, obs.hparams)
    rows = rules.hparam_rows(hparams)
    events = tuple({'event': 'restart', 'step': obs.update_steps,
                    'env_steps': obs.env_steps, 'member': int(m),
                    'score': float(scores[m]), 'hparams': rows[m]}
                   for m in worst)
    rule_state = rule_state._replace(
        rung_start=obs.member_update_steps.copy(), returns=np.zeros(n),
        counts=np.zeros(n, np.int64),
        restarts=np.asarray(rule_state.restarts + len(worst), np.int64))
    return rule_state, rules.Decision(
        hparams=hparams, reinit=(restart, k_weights), restart=restart,
        renewed=restart, events=events)

  def scalars(self, rule_state):
    return {'restarts': int(rule_state.restarts)}

  def summary(self, rule_state, run_dir):
    return f'halving: {int(rule_state.restarts)} members restarted'
