"""Evaluating one policy in the learner process (host-side; not jittable).

For policies that no actor hosts, such as the CEM distribution's mean in
CEM-RL: a plain gymnasium loop, noise-free actions, seeded resets.
"""

from __future__ import annotations

import gymnasium as gym
import jax
import numpy as np
from acme import specs

from fastpbrl.types import scale_action


def evaluate_policy(agent, env_id: str, policy_params, episodes: int,
                    seed: int) -> list[float]:
  """Returns of ``episodes`` noise-free episodes of ``policy_params``."""
  act = jax.jit(lambda p, obs: agent.act(p, obs[None], jax.random.PRNGKey(0),
                                         agent.default_hparams(), False)[0])
  discrete = isinstance(agent.env_spec.actions, specs.DiscreteArray)
  env = gym.make(env_id)
  returns = []
  try:
    for episode in range(episodes):
      obs, _ = env.reset(seed=seed + episode)
      total, done = 0.0, False
      while not done:
        action = np.asarray(act(policy_params, np.asarray(obs, np.float32)))
        if not discrete:
          action = scale_action(action, agent.env_spec.actions)
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        done = terminated or truncated
      returns.append(total)
  finally:
    env.close()
  return returns
