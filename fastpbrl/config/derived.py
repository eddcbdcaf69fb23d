"""Settings as a run uses them: unset ones from the budget, intervals in
the learner's units.

``resolved`` derives each setting left unset from the budget, as the run's
data path (``path_kind``) uses it;
``as_update_steps`` and ``as_learner_calls`` turn an interval flag (env
steps per member) into the units the loop acts in. Host-side; not
jittable.
"""

from __future__ import annotations

import dataclasses

from fastpbrl.config.agent_settings import agent_spec, steps_per_call_of
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import C, RunConfig
from fastpbrl.datapath.kinds import PathKind, kind_of


def resolved(config: C) -> C:
  """``config`` with each unset setting of ``follows_budget`` derived from
  the budget (``Derived``), so that any budget runs with the defaults; what
  a run uses, writes to config.json and ``--print-config`` shows. An
  invalid budget leaves them at their full-budget values (``validate``
  names the budget). Idempotent; a set value is kept, and checked as given."""
  if not isinstance(config, RunConfig):
    return config  # an object with RunConfig's fields: already resolved
  budget = config.member_budget()
  usable = (isinstance(budget, int) and not isinstance(budget, bool)
            and budget > 0)
  values = {}
  for name, derived in type(config).follows_budget.items():
    if name == 'warmup_steps' and not _random_warmup(config):
      if config.warmup_steps is None:  # no random warm-up: config.json says 0
        values[name] = 0
    elif getattr(config, name) is None:
      values[name] = (max(derived.least,
                          min(derived.value, budget // derived.divisor))
                      if usable else derived.value)
  return dataclasses.replace(config, **values) if values else config


def path_kind(config: RunConfig) -> PathKind:
  """The kind of data path ``config`` runs on (``fastpbrl.datapath.kinds``:
  whether it keeps a replay, whether members warm up at random).

  Raises:
    ConfigError: ``--agent`` names no agent.
  """
  return kind_of(agent_spec(config.agent), config.env)


def _random_warmup(config) -> bool:
  """Whether members of ``config``'s path warm up with random actions
  (True for an agent it cannot find: ``validate`` names the flag)."""
  try:
    return path_kind(config).random_warmup
  except ConfigError:
    return True


def restart_warmup_steps(config: RunConfig) -> int:
  """Env steps a restarted member acts at random before it learns again:
  ``--warmup-steps`` on a path with a random warm-up, else none (a member
  that learns from its own rollouts acts with its policy from the first
  step, whatever ``--warmup-steps`` says)."""
  return path_kind(config).warmup_steps(resolved(config).warmup_steps)


def as_update_steps(env_steps: float, config: RunConfig) -> int:
  """An interval in env steps per member (every interval flag's unit) as
  update steps per member: x ``--update-to-data-ratio``, the pace the
  learner keeps; at least 1 unless the interval is 0."""
  if env_steps == 0:
    return 0
  return max(1, round(env_steps * config.update_to_data_ratio))


def as_learner_calls(env_steps: float, config: RunConfig) -> int:
  """An interval in env steps per member as whole learner calls (update
  steps / steps per call); at least 1 unless the interval is 0."""
  if env_steps == 0:
    return 0
  return max(1, round(env_steps * config.update_to_data_ratio
                      / steps_per_call_of(config)))
