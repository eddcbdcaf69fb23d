"""The learning benchmark's single-agent references: Stable-Baselines3's
agents, one per member slot at our settings or rl-baselines3-zoo's, and our
own agent in a plain synchronous loop (no actors, rate limiter or
prefetch), to tell a gap to SB3 in the data path from one in the agent.

Stable-Baselines3 and PyTorch are the ``.[torch]`` extra: imported where a
reference run starts, so that the rest of the benchmark runs without them.
"""

from __future__ import annotations

import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.learning.suite import ZOO_PPO, task_budget
from fastpbrl import agents as agents_lib
from fastpbrl.agents.base import POPULATION_AXIS
from fastpbrl.core.types import Transition, make_env_spec, scale_action
from fastpbrl.datapath.evaluation import evaluate_population, evaluation_seeds
from fastpbrl.envs.gym import make_env


def sb3_zoo_ppo(sb3, task_name: str, seed: int):
  """SB3's PPO at ``ZOO_PPO[task_name]`` as rl-zoo builds it (one env,
  VecNormalize with the agent's gamma when ``normalize``), and the function
  that maps a raw observation to what its policy sees (the training
  statistics, frozen while it evaluates, as rl-zoo's evaluation does)."""
  import torch  # noqa: PLC0415
  from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize  # noqa: PLC0415

  zoo = dict(ZOO_PPO[task_name])
  venv = DummyVecEnv([lambda: gym.make(task_name)])
  if zoo.pop('normalize'):
    venv = VecNormalize(venv, gamma=zoo['gamma'])
  activation = {'relu': torch.nn.ReLU, 'tanh': torch.nn.Tanh}[
      zoo.pop('activation')]
  arch = list(zoo.pop('net_arch'))
  policy_kwargs = dict(log_std_init=zoo.pop('log_std_init'),
                       ortho_init=zoo.pop('ortho_init'),
                       activation_fn=activation,
                       net_arch=dict(pi=arch, vf=arch))
  model = sb3.PPO('MlpPolicy', venv, seed=seed, verbose=0, device='cpu',
                  policy_kwargs=policy_kwargs, **zoo)
  if isinstance(venv, VecNormalize):
    return model, venv.normalize_obs
  return model, lambda obs: obs


def run_sb3(args, task_name: str, algo: str, seed: int,
            own_defaults: bool = False, zoo: bool = False) -> dict:
  """``--population-size`` Stable-Baselines3 agents, one after the other,
  each with the Fujimoto et al. / Haarnoja et al. defaults that our agents
  use (256x256, Adam 3e-4, batch 256, tau 0.005, gamma 0.99, one update
  per env step, TD3 exploration noise 0.1), our warm-up length, and the
  same evaluation (noise-free, ``--eval-episodes`` episodes); with
  ``zoo``, SB3's PPO at rl-zoo's settings for the task
  (``sb3_zoo_ppo``)."""
  try:
    import stable_baselines3 as sb3  # noqa: PLC0415
    from stable_baselines3.common.logger import Logger  # noqa: PLC0415
    from stable_baselines3.common.noise import NormalActionNoise  # noqa: PLC0415
  except ImportError as e:
    raise SystemExit(f'{algo}: Stable-Baselines3 is not installed ({e}); '
                     "install the torch extra: pip install -e '.[torch]'") from None
  import torch  # noqa: PLC0415

  torch.set_num_threads(1)
  task = task_budget(args, task_name)
  finals, curves, start = [], [], time.monotonic()
  for member in range(args.population_size):
    member_seed = seed * 1000 + member
    env = gym.make(task_name)
    kwargs = dict(learning_rate=3e-4, buffer_size=1_000_000,
                  learning_starts=task.warmup_steps, batch_size=256,
                  tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1,
                  policy_kwargs={'net_arch': [256, 256]}, seed=member_seed,
                  verbose=0, device='cpu')
    observe = lambda obs: obs  # noqa: E731 (what the policy sees)
    if zoo:
      env.close()
      model, observe = sb3_zoo_ppo(sb3, task_name, member_seed)
    elif algo == 'ppo':  # SB3's defaults are our PPO's
      model = sb3.PPO('MlpPolicy', env, seed=member_seed, verbose=0,
                      device='cpu')
    elif own_defaults:
      model = (sb3.TD3 if algo == 'td3' else sb3.SAC)(
          'MlpPolicy', env, seed=member_seed, verbose=0, device='cpu')
    elif algo == 'td3':
      dim = env.action_space.shape[0]
      model = sb3.TD3('MlpPolicy', env, action_noise=NormalActionNoise(
          np.zeros(dim), 0.1 * np.ones(dim)), **kwargs)
    else:
      model = sb3.SAC('MlpPolicy', env, **kwargs)
    # Without a logger of its own, every learn() call makes an empty
    # SB3-<date> folder in the system's temporary directory.
    model.set_logger(Logger(folder=None, output_formats=[]))
    eval_env = gym.make(task_name)

    def evaluate():
      returns = []
      for reset_seed in evaluation_seeds(seed, member, args.eval_episodes):
        obs, _ = eval_env.reset(seed=reset_seed)
        total, done = 0.0, False
        while not done:
          action, _ = model.predict(observe(obs), deterministic=True)
          obs, r, term, trunc, _ = eval_env.step(action)
          total += float(r)
          done = term or trunc
        returns.append(total)
      return float(np.mean(returns))

    curve, done_steps = [], 0
    while done_steps < task.env_steps:
      chunk = min(task.eval_every, task.env_steps - done_steps)
      model.learn(total_timesteps=chunk, reset_num_timesteps=False)
      done_steps += chunk
      curve.append((done_steps, evaluate()))
    finals.append(curve[-1][1])
    curves.append(curve)
    env.close()
    eval_env.close()
  grid = sorted({s for c in curves for s, _ in c})
  merged = []
  for s in grid:
    values = [v for c in curves for t, v in c if t == s]
    merged.append((s, max(values), float(np.mean(values))))
  return {'final_returns': finals, 'wall_time_s': time.monotonic() - start,
          'env_steps': task.env_steps, 'curve': merged,
          'sb3_version': sb3.__version__, 'torch_version': torch.__version__,
          'command': f'stable_baselines3.{algo.upper()} x '
                     f'{args.population_size}, see '
                     'benchmarks/learning/references.py'}


def run_sync(args, task_name: str, agent_name: str, seed: int) -> dict:
  """``--population-size`` members of our agent at its defaults, stepped
  together in one process: each loop iteration takes one env step per
  member (uniform random actions during the warm-up, then the agent's
  exploring ``act``) and, once the warm-up is over, one update per member
  (``jax.vmap`` of the agent's ``update``) on a batch sampled uniformly
  from all of that member's transitions so far. Updates start at zero when
  the warm-up ends, as in SB3's loop; evaluations are the baseline's
  (``evaluate_population``, the same reset seeds)."""
  task = task_budget(args, task_name)
  n = args.population_size
  envs = [make_env(task_name) for _ in range(n)]
  env_spec = make_env_spec(envs[0])
  agent = agents_lib.make_agent(agent_name, env_spec)
  batch_size = agent.config.batch_size
  hparams = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,)),
                         agent.default_hparams())
  key = jax.random.PRNGKey(seed)
  key, init_key = jax.random.split(key)
  state = jax.jit(jax.vmap(agent.init))(jax.random.split(init_key, n), hparams)
  # Named like the learner's population axis, so TD3's delayed policy step
  # stays a real cond (``any_member``), as in the learner.
  update = jax.jit(jax.vmap(lambda st, hp, b: agent.update(st, hp, b)[0],
                            axis_name=POPULATION_AXIS))
  act = jax.jit(jax.vmap(
      lambda p, o, k, h: agent.act(p, o[None], k, h, True)[0]))
  policy_params = jax.jit(jax.vmap(agent.policy_params))

  obs_dim = env_spec.observations.shape
  act_dim = env_spec.actions.shape
  cap = task.env_steps
  replay = dict(
      observation=np.zeros((n, cap, *obs_dim), np.float32),
      action=np.zeros((n, cap, *act_dim), np.float32),
      reward=np.zeros((n, cap), np.float32),
      next_observation=np.zeros((n, cap, *obs_dim), np.float32),
      terminated=np.zeros((n, cap), np.float32),
      truncated=np.zeros((n, cap), np.float32))
  seqs = [np.random.SeedSequence(seed, spawn_key=(1, m)) for m in range(n)]
  rngs = [np.random.default_rng(s) for s in seqs]
  sampler = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
  obs = np.stack([env.reset(seed=int(s.generate_state(1)[0]))[0]
                  for env, s in zip(envs, seqs)]).astype(np.float32)
  rows = np.arange(n)[:, None]
  curve, start = [], time.monotonic()
  for t in range(cap):
    if t < task.warmup_steps:
      actions = np.stack([r.uniform(-1.0, 1.0, act_dim) for r in rngs]
                         ).astype(np.float32)
    else:
      step_keys = jax.random.split(jax.random.fold_in(key, t), n)
      actions = np.asarray(act(state.policy, jnp.asarray(obs), step_keys,
                               hparams))
    env_actions = scale_action(actions, env_spec.actions)
    for m, env in enumerate(envs):
      o, r, term, trunc, _ = env.step(env_actions[m])
      for name, value in (('observation', obs[m]), ('action', actions[m]),
                          ('reward', r), ('next_observation', o),
                          ('terminated', float(term)),
                          ('truncated', float(trunc))):
        replay[name][m, t] = value
      if term or trunc:
        o, _ = env.reset(seed=int(rngs[m].integers(2**31)))
      obs[m] = o
    if t + 1 > task.warmup_steps:
      idx = sampler.integers(0, t + 1, (n, batch_size))
      batch = Transition(**{k: jnp.asarray(v[rows, idx])
                            for k, v in replay.items()})
      state = update(state, hparams, batch)
    if (t + 1) % task.eval_every == 0 or t + 1 == cap:
      returns, _, _ = evaluate_population(
          agent, lambda: make_env(task_name), policy_params(state), hparams,
          args.eval_episodes, seed)
      means = returns.mean(axis=1)
      curve.append((t + 1, float(means.max()), float(means.mean())))
      finals = [float(v) for v in means]
      print(f'{task_name} sync-{agent_name} seed {seed}: {t + 1} env steps '
            f'per member, returns {np.round(means).tolist()}', flush=True)
  for env in envs:
    env.close()
  return {'final_returns': finals, 'wall_time_s': time.monotonic() - start,
          'env_steps': task.env_steps, 'curve': curve,
          # Counted by the agent's own step counter, not by a formula.
          'update_steps': int(np.asarray(state.step)[0]),
          'command': f'our {agent_name} agent in a synchronous loop, '
                     'see benchmarks/learning/references.py (run_sync)'}
