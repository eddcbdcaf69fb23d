"""What several rules' drivers share (host-side; not jittable).

The search space a rule samples from (``--search-space`` or the agent's
default) and its check against the agent's hyperparameters; the shared-critic
check of CEM-RL and DvD; ``FreshEpisodes``, which keeps episodes that started
under a member's old weights from scoring its new ones (PBT, HyperTrick,
CEM-RL); and the check that every span a rule scores holds an evaluation.
"""

from __future__ import annotations

import numpy as np

from fastpbrl.population import search_space as ss
from fastpbrl.run import ConfigError, Loop, RunConfig, _check, agent_spec


def _search_space(config: RunConfig) -> ss.SearchSpace:
  """``--search-space FILE`` if given, else the agent's default space."""
  path = getattr(config, 'search_space', None)
  if path is None:
    return agent_spec(config.agent).default_search_space
  try:
    return ss.load(path)
  except ValueError as e:
    raise ConfigError(f'--search-space {path}: {e}') from None


def _validate_space(config: RunConfig, space: ss.SearchSpace,
                    defaults) -> None:
  """Every field of the space is a hyperparameter of the agent."""
  try:
    ss.validate(space, defaults)
  except ValueError as e:
    path = getattr(config, 'search_space', None)
    if path:
      source = f'--search-space {path}'
    elif space == agent_spec(config.agent).default_search_space:
      source = f'the default search space of --agent {config.agent}'
    else:  # a space passed to the driver in code
      source = 'the search space'
    raise ConfigError(f'{source}: {e}') from None


def _check_shared_critic(rule: str, config: RunConfig) -> None:
  """CEM-RL and DvD train deterministic policies through one critic shared
  by the population: the agent must register that update
  (``register(..., shared_critic=...)``; of the built-ins, TD3 does)."""
  spec = agent_spec(config.agent)
  _check(spec.shared_critic is not None,
         f'{rule} needs deterministic policies trained through one shared '
         f'critic: --agent {config.agent} registers no shared_critic update '
         '(of the built-in agents only td3 does)')


class FreshEpisodes:
  """Host-side. Per member, the first policy version whose episodes count.

  After a member's weights are replaced (PBT exploit, HyperTrick restart,
  a new CEM-RL generation),
  episodes that started under its old weights still arrive for a while;
  they must not score the new weights. ``renew`` marks members replaced by
  this call (their new weights go out with the next publish); ``keep``
  filters episode records by the version they started under.
  """

  def __init__(self, population_size: int):
    self.first_version = np.zeros((population_size,), np.int64)

  def keep(self, record) -> bool:
    return (record['start_policy_version']
            >= self.first_version[int(record['member'])])

  def renew(self, loop: Loop, members: np.ndarray) -> None:
    # Parameters are published by a thread: the store's version counts
    # only what it has written. Once everything submitted is written, the
    # next version is the first with the new weights (a rule decision, so
    # this short wait is off the per-call path).
    loop.pipeline.wait_published()
    self.first_version[members] = loop.pipeline.policy_version + 1

  def restart(self) -> None:
    """A resumed run's pipeline numbers versions from zero again."""
    self.first_version[:] = 0


def _check_evaluations_per(span_update_steps: float, config: RunConfig,
                           span_flags: str) -> None:
  """A rule that scores every span of update steps needs an evaluation
  to start inside each span."""
  span_env_steps = span_update_steps / config.update_to_data_ratio
  _check(config.eval_every <= span_env_steps,
         f'--eval-every {config.eval_every} is longer than one {span_flags} '
         f'span ({span_env_steps:.0f} env steps per member): spans would end '
         'without an evaluation to score them; lower --eval-every or lengthen '
         'the span')
