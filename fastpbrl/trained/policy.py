"""One trained member's policy (host-side; its action is one jitted call):
act with it (``policy(observation)``, SB3's ``policy.predict``), and save
it alone to a small file and load it back.

``fastpbrl.load_policy(run_dir)`` builds one from a run's checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from acme import specs

from fastpbrl import agents as agents_lib
from fastpbrl.config.agent_settings import agent_spec
from fastpbrl.config.errors import ConfigError
from fastpbrl.core.types import scale_action
from fastpbrl.run.build import make_env_spec

# The layout of Policy.save's files.
FORMAT = 'fastpbrl-policy-1'


class Policy:
  """A trained member's evaluation policy: ``policy(observation) ->
  action`` on numpy arrays, one observation (shape of the env's
  observations) or a batch (a leading axis); actions in the env's own
  units (scaled to its action bounds, or integer actions).

  ``save(path)`` writes it alone to a small file, which
  ``fastpbrl.load_policy(path)`` (or ``Policy.load``) reads back.

  Attributes:
    member: the member's index in its run.
    env_id: the env it was trained on (``config.env``).
    agent_ref: its agent, as ``--agent`` names it.
  """

  def __init__(self, agent, policy_params, hparams, member: int, env_id: str,
               seed: int = 0, agent_ref: Optional[str] = None):
    self.member = member
    self.env_id = env_id
    self.agent_ref = agent_ref or agent.name
    self._agent = agent
    self._params = policy_params
    self._hparams = hparams
    self._key = jax.random.PRNGKey(seed)  # DQN's epsilon-greedy draws
    self._act = {explore: jax.jit(functools.partial(_act, agent,
                                                    explore=explore))
                 for explore in (False, True)}

  def __call__(self, observation) -> np.ndarray:
    return self._actions(observation, explore=False)

  def predict(self, observation, state=None, episode_start=None,
              deterministic: bool = True) -> tuple[np.ndarray, None]:
    """Stable-Baselines3's ``predict``: ``(action, None)`` (no recurrent
    state), so SB3's ``evaluate_policy(policy, env)`` runs it.
    ``deterministic=False`` acts as the member explored in training (TD3:
    Gaussian noise of its ``exploration_noise``; SAC: a sampled action;
    DQN: epsilon-greedy at its ``epsilon``, the end of its annealing)."""
    del state, episode_start  # feed-forward policies
    return self._actions(observation, explore=not deterministic), None

  def _actions(self, observation, explore: bool) -> np.ndarray:
    spec = self._agent.env_spec
    obs = np.asarray(observation, dtype=spec.observations.dtype)
    shape = tuple(spec.observations.shape)
    single = obs.shape == shape
    if single:
      obs = obs[None]
    elif obs.shape[1:] != shape:
      raise ValueError(f'observation of shape {obs.shape}: expected {shape} '
                       f'or [batch, *{shape}]')
    self._key, key = jax.random.split(self._key)
    actions = np.asarray(self._act[explore](self._params, obs, key,
                                            self._hparams))
    if not isinstance(spec.actions, specs.DiscreteArray):
      actions = scale_action(actions, spec.actions)
    return actions[0] if single else actions

  def save(self, path: str) -> None:
    """Writes this policy alone (its parameters, acting hyperparameters,
    agent settings and env id) to ``path``, a NumPy ``.npz`` file."""
    record = {'format': FORMAT, 'agent': self.agent_ref,
              'agent_config': dataclasses.asdict(self._agent.config),
              'env': self.env_id, 'member': self.member}
    arrays = {f'params{k}': v for k, v in _leaves(self._params).items()}
    arrays.update({f'hparams{k}': v
                   for k, v in _leaves(self._hparams).items()})
    tmp = f'{path}.tmp.npz'
    np.savez(tmp, record=np.asarray(json.dumps(record)), **arrays)
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str, seed: int = 0) -> 'Policy':
    """The policy ``save`` wrote to ``path``; its agent is rebuilt from
    the registry (an agent of your own must be importable, as for a
    run) on the env it was trained on."""
    try:
      with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
      raise ConfigError(f'{path!r} is not a policy file Policy.save wrote '
                        f'({e})') from None
    record = json.loads(str(arrays.pop('record', '{}')))
    if record.get('format') != FORMAT:
      raise ConfigError(f'{path!r} is not a policy file of this fastpbrl '
                        f'(format {record.get("format")!r}, expected '
                        f'{FORMAT!r})')
    spec = agent_spec(record['agent'])
    settings = {k: tuple(v) if isinstance(v, list) else v
                for k, v in record['agent_config'].items()}
    agent = agents_lib.make_agent(record['agent'],
                                  make_env_spec(record['env']),
                                  spec.config(**settings))
    template = agent.init(jax.random.PRNGKey(0), agent.default_hparams())
    params = _fill(agent.policy_params(template), arrays, 'params')
    hparams = _fill(agent.default_hparams(), arrays, 'hparams')
    return cls(agent, params, hparams, record['member'], record['env'], seed,
               agent_ref=record['agent'])


def _act(agent, params, observation, key, hparams, explore: bool):
  return agent.act(params, observation, key, hparams, explore)


def _leaves(tree) -> dict:
  """``{path: numpy leaf}`` of a pytree, paths as ``jax.tree_util.keystr``."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def _fill(template, arrays: dict, prefix: str):
  """``template`` with each leaf read from ``arrays[prefix + path]``, in
  the template's shape and dtype."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(template)
  leaves = []
  for path, like in flat:
    name = prefix + jax.tree_util.keystr(path)
    if name not in arrays or arrays[name].shape != np.shape(like):
      raise ConfigError(f'the policy file has no {name} of shape '
                        f'{np.shape(like)}: written for other networks')
    leaves.append(jnp.asarray(arrays[name], jnp.asarray(like).dtype))
  return jax.tree_util.tree_unflatten(treedef, leaves)
