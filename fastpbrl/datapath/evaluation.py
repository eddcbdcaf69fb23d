"""Evaluating policies in the learner process (host-side; not jittable).

For policies that no actor hosts at that moment: every member's final
policy at the end of a run's budget, and the CEM distribution's mean in
CEM-RL. Noise-free actions (``act(..., explore=False)``), seeded resets,
one policy version for every episode.

``evaluate_population`` steps ``N x K`` environments (``K`` episodes of
each of ``N`` policies) in lockstep and chooses all their actions in ONE
vectorized call per step, as the actors do, so a population's final
evaluation costs about as many policy calls as one episode.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from acme import specs

from fastpbrl.actors.env_batch import true_objective
from fastpbrl.core.types import scale_action
from fastpbrl.envs import params as env_params
from fastpbrl.envs.gym import make_env

EVAL_STREAM = 2  # spawn_key[0] of the evaluation seed sequences (actors: 1)


def evaluation_seeds(seed: int, member: int, episodes: int) -> list[int]:
  """Reset seeds of ``member``'s evaluation episodes, from the run seed."""
  seq = np.random.SeedSequence(seed, spawn_key=(EVAL_STREAM, member))
  return [int(s) for s in seq.generate_state(episodes, np.uint32)]


def evaluate_population(agent, env_fn: Callable[[], Any], policy_params,
                        hparams, episodes: int, seed: int,
                        members: Optional[list[int]] = None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Returns ``(returns, lengths, objectives)``, each ``[N, episodes]``:
  noise-free episodes of each policy, in envs acting with each member's
  env parameters (``fastpbrl.envs.params``); ``objectives`` are the envs'
  ``info['true_objective']`` at each episode's end (NaN where none).

  Args:
    agent: the agent whose ``act`` plays the policies.
    env_fn: builds one environment (called ``N x episodes`` times).
    policy_params: ``[N, ...]`` stacked policy parameters.
    hparams: ``[N]`` stacked hyperparameters ``act`` reads, or ``None`` for
      the agent's defaults.
    episodes: episodes per policy.
    seed: the run seed; member ``m``'s episode ``k`` resets with
      ``evaluation_seeds(seed, m, episodes)[k]``.
    members: the population index of each row (default ``0..N-1``), for the
      seeds.
  """
  if episodes < 1:
    raise ValueError(f'episodes must be >= 1, got {episodes}')
  n = int(jax.tree.leaves(policy_params)[0].shape[0])
  members = list(range(n)) if members is None else list(members)
  if hparams is None:
    hparams = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,)),
                           agent.default_hparams())
  rows = np.repeat(np.arange(n), episodes)  # env i plays policy rows[i]
  params = jax.tree.map(lambda x: jnp.asarray(x)[rows], policy_params)
  hps = jax.tree.map(lambda x: jnp.asarray(x)[rows], hparams)

  def one(p, h, obs, key):
    return agent.act(p, obs[None], key, h, False)[0]

  act = jax.jit(jax.vmap(one))
  discrete = isinstance(agent.env_spec.actions, specs.DiscreteArray)
  envs = [env_fn() for _ in rows]
  try:
    values = {k: np.asarray(v) for k, v in env_params.env_part(
        hparams).items()}
    for env, row in zip(envs, rows) if values else ():
      # each member's env parameters (``fastpbrl.envs.params``)
      env_params.setter(env)({k: float(v[row]) for k, v in values.items()})
    obs = np.stack([
        env.reset(seed=evaluation_seeds(seed, members[m], episodes)[k])[0]
        for env, (m, k) in zip(envs, ((r, i % episodes)
                                      for i, r in enumerate(rows)))
    ]).astype(agent.env_spec.observations.dtype)
    totals = np.zeros(len(envs))
    objectives = np.full(len(envs), np.nan)
    lengths = np.zeros(len(envs), np.int64)
    active = np.ones(len(envs), bool)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(envs))
    t = 0
    while active.any():
      step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, t)
      actions = np.asarray(act(params, hps, obs, step_keys))
      if not discrete:
        actions = scale_action(actions, agent.env_spec.actions)
      for i in np.flatnonzero(active):
        o, r, terminated, truncated, info = envs[i].step(actions[i])
        totals[i] += float(r)
        lengths[i] += 1
        obs[i] = o
        if terminated or truncated:
          active[i] = False
          objectives[i] = true_objective(info)
      t += 1
  finally:
    for env in envs:
      env.close()
  return (totals.reshape(n, episodes), lengths.reshape(n, episodes),
          objectives.reshape(n, episodes))


def evaluate_policy(agent, env_id: str, policy_params, episodes: int,
                    seed: int) -> list[float]:
  """Returns of ``episodes`` noise-free episodes of ONE policy
  (``policy_params`` without a population axis)."""
  stacked = jax.tree.map(lambda x: jnp.asarray(x)[None], policy_params)
  returns, _, _ = evaluate_population(agent, lambda: make_env(env_id), stacked,
                                   None, episodes, seed)
  return [float(r) for r in returns[0]]
