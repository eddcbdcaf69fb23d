"""Python API: train a population, then use what it trained (host-side).

    import fastpbrl

    result = fastpbrl.train('pbt', env='Pendulum-v1', env_steps=30_000)
    policy = fastpbrl.load_policy(result.run_dir)            # the best member
    action = policy(observation)                             # numpy in, numpy out
    scores = fastpbrl.evaluate(result.run_dir, episodes=10)  # mean, std, returns

``train`` runs the same loop as the ``fastpbrl <rule>`` commands; a run
folder is all that ``load_policy`` and ``evaluate`` need: they rebuild the
agent from its ``config.json``, restore the latest checkpoint, and act with
the agent's evaluation action (``act(..., explore=False)``: noise-free for
TD3 and SAC, epsilon-greedy at 0.05 for DQN), as the run's own evaluations
do. "best" is the member whose final evaluation (``final_returns.json``,
written at the end of every run) has the highest mean.

Nothing here is jittable; ``Policy`` jits the agent's ``act`` once.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional, Sequence, Union

import numpy as np

from fastpbrl.run import Callback, ConfigError, RunResult

Member = Union[str, int]


def _rules() -> dict:
  """rule -> (config class, driver class), imported on first use."""
  from fastpbrl.rules import cemrl, dvd, hypertrick, pbt, seeds  # noqa: PLC0415
  from fastpbrl.run import RunConfig  # noqa: PLC0415
  return {
      'pbt': (pbt.PBTRunConfig, pbt.PBTDriver),
      'cemrl': (cemrl.CEMRLRunConfig, cemrl.CEMRLDriver),
      'dvd': (dvd.DvDRunConfig, dvd.DvDDriver),
      'hypertrick': (hypertrick.HyperTrickRunConfig, hypertrick.HyperTrickDriver),
      'seeds': (RunConfig, seeds.SeedsDriver),
  }


@dataclasses.dataclass
class TrainResult:
  """What ``train`` returns."""

  run_dir: str
  best_member: int  # index of the member with the best final evaluation
  best_final_return: float  # its final evaluation's mean return
  checkpoint: str  # folder of the run's latest checkpoint (all members)
  lineage: list  # PBT: the events of lineage.jsonl, in order; else []
  run: RunResult  # everything else: final returns, hparams, counters...


def train(rule: str = 'pbt', *, callbacks: Sequence[Callback] = (),
          **config_fields: Any) -> TrainResult:
  """Trains a population with ``rule`` and returns where its best member is.

  Args:
    rule: ``pbt``, ``cemrl``, ``dvd``, ``hypertrick`` or ``seeds``.
    callbacks: ``fastpbrl.Callback`` instances (``after_call(loop)``,
      ``after_rule_decision(loop, event)``).
    **config_fields: the rule's settings, named as the command's flags with
      ``_`` for ``-`` (``env_steps=600``, ``hidden_sizes=(16, 16)``); the
      rest keep their defaults (``fastpbrl <rule> --help``).

  Raises:
    ConfigError: an unknown rule or setting, or an invalid value (the
      message names it as the flag: ``--env-steps must be > 0``).
  """
  rules = _rules()
  if rule not in rules:
    raise ConfigError(f'rule {rule!r} is unknown; choose one of '
                      f'{", ".join(rules)}')
  config_cls, driver_cls = rules[rule]
  fields = {f.name for f in dataclasses.fields(config_cls)}
  unknown = sorted(set(config_fields) - fields)
  if unknown:
    raise ConfigError(f'{rule} has no setting {unknown[0]!r} '
                      f'(--{unknown[0].replace("_", "-")}); see fastpbrl '
                      f'{rule} --help')
  if 'hidden_sizes' in config_fields:
    config_fields['hidden_sizes'] = tuple(config_fields['hidden_sizes'])
  from fastpbrl.run import run  # noqa: PLC0415

  from fastpbrl import distributed  # noqa: PLC0415
  distributed.initialize_if_launched()  # under fastpbrl.launch or srun
  driver = driver_cls(config_cls(**config_fields))
  result = run(driver.config, driver, callbacks=callbacks)
  best = int(np.argmax(result.final_returns))
  lineage_path = os.path.join(result.run_dir, 'lineage.jsonl')
  lineage = []
  if rule == 'pbt' and os.path.exists(lineage_path):
    from fastpbrl.population.pbt import read_lineage  # noqa: PLC0415
    lineage = read_lineage(lineage_path)
  return TrainResult(run_dir=result.run_dir, best_member=best,
                     best_final_return=float(result.final_returns[best]),
                     checkpoint=latest_checkpoint(result.run_dir),
                     lineage=lineage, run=result)


def latest_checkpoint(run_dir: str) -> str:
  """The folder of ``run_dir``'s latest complete checkpoint."""
  from fastpbrl.checkpoint import Checkpointer  # noqa: PLC0415
  checkpointer = Checkpointer(run_dir)
  try:
    step = checkpointer.latest_step()
  finally:
    checkpointer.close()
  if step is None:
    raise FileNotFoundError(f'{run_dir!r} holds no complete checkpoint')
  return os.path.join(checkpointer.directory, str(step))


def _saved_config(run_dir: str) -> dict:
  path = os.path.join(run_dir, 'config.json')
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    raise ConfigError(f'{run_dir!r} has no config.json: not a fastpbrl run '
                      'folder') from None


def best_member(run_dir: str) -> int:
  """The member with the highest final-evaluation mean in ``run_dir``'s
  ``final_returns.json``.

  Raises:
    ConfigError: the run has no final evaluation (unfinished, or killed).
  """
  from fastpbrl.logging import FINAL_RETURNS, read_final_returns  # noqa: PLC0415
  try:
    returns = read_final_returns(run_dir)['final_returns']
  except FileNotFoundError:
    raise ConfigError(
        f'{run_dir!r} has no {FINAL_RETURNS} (the run has not finished): '
        'pass a member index instead of best') from None
  return int(np.argmax(returns))


def resolve_member(run_dir: str, member: Member, population_size: int) -> int:
  """``'best'`` or an index (int, or a string of digits) to an index."""
  if member == 'best':
    return best_member(run_dir)
  try:
    index = int(member)
  except (TypeError, ValueError):
    raise ConfigError(f'--member must be best or a member index, got '
                      f'{member!r}') from None
  if not 0 <= index < population_size:
    raise ConfigError(f'--member {index} is out of range: the run has '
                      f'{population_size} members (0..{population_size - 1})')
  return index


def restore_run(run_dir: str):
  """Rebuilds ``run_dir``'s agent, learner and driver from its config.json
  and restores its latest checkpoint.

  Returns:
    ``(config, agent, driver, learner, state, hparams)``, the stacked
    training state and hyperparameters as the run last saved them.
  """
  import jax  # noqa: PLC0415

  from fastpbrl import run as run_lib  # noqa: PLC0415
  from fastpbrl.checkpoint import Checkpointer  # noqa: PLC0415
  from fastpbrl.rules.pbt import ScheduleDriver  # noqa: PLC0415

  saved = _saved_config(run_dir)
  name = saved.get('driver')
  rules = _rules()
  if name == 'pbt-rerun':
    config_cls = run_lib.RunConfig
    make_driver = lambda c: ScheduleDriver(c, [(0, {})])  # noqa: E731
  elif name in rules:
    config_cls, make_driver = rules[name]
  else:
    raise ConfigError(f'{run_dir!r}: unknown rule {name!r} in config.json')
  names = {f.name for f in dataclasses.fields(config_cls)}
  values = {k: tuple(v) if isinstance(v, list) else v
            for k, v in saved.items() if k in names}
  # The folder is read, not written: no run-dir / resume checks.
  values.update(run_dir=None, resume=None, progress=False)
  driver = make_driver(config_cls(**values))
  config = driver.config
  agent = run_lib.make_agent(config, run_lib.make_env_spec(config.env))
  learner = driver.make_learner(agent, agent.config.steps_per_call)
  # Templates shaped as in ``run``: the restore overwrites every value.
  key = jax.random.PRNGKey(config.seed)
  k_hparams, k_init, k_rule = jax.random.split(key, 3)
  hparams = driver.initial_hparams(k_hparams, agent, config.population_size)
  k_init, k_driver = jax.random.split(k_init)
  state = driver.initialize(k_driver, learner.init(k_init, hparams), agent)
  checkpointer = Checkpointer(run_dir)
  try:
    state, extra, _ = checkpointer.restore(
        state, {'hparams': hparams, 'rule_key': k_rule,
                'driver': driver.checkpoint_arrays()})
  finally:
    checkpointer.close()
  return config, agent, driver, learner, state, extra['hparams']


class Policy:
  """A trained member's evaluation policy: ``policy(observation) ->
  action`` on numpy arrays, one observation (shape of the env's
  observations) or a batch (a leading axis); actions in the env's own
  units (scaled to its action bounds, or integer actions).

  Attributes:
    member: the member's index in its run.
    env_id: the env it was trained on (``config.env``).
  """

  def __init__(self, agent, policy_params, hparams, member: int, env_id: str,
               seed: int = 0):
    import jax  # noqa: PLC0415

    self.member = member
    self.env_id = env_id
    self._agent = agent
    self._params = policy_params
    self._hparams = hparams
    self._key = jax.random.PRNGKey(seed)  # DQN's epsilon-greedy draws
    self._act = jax.jit(lambda p, obs, key, h: agent.act(p, obs, key, h, False))

  def __call__(self, observation) -> np.ndarray:
    import jax  # noqa: PLC0415
    from acme import specs  # noqa: PLC0415

    from fastpbrl.types import scale_action  # noqa: PLC0415

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
    actions = np.asarray(self._act(self._params, obs, key, self._hparams))
    if not isinstance(spec.actions, specs.DiscreteArray):
      actions = scale_action(actions, spec.actions)
    return actions[0] if single else actions


def load_policy(run_dir: str, member: Member = 'best', seed: int = 0
                ) -> Policy:
  """The evaluation policy of ``member`` (``'best'`` or an index) of the
  run in ``run_dir``, from its latest checkpoint.

  ``seed`` seeds the policy's own random draws (DQN's evaluation epsilon);
  TD3 and SAC act deterministically.
  """
  import jax  # noqa: PLC0415

  config, agent, driver, learner, state, hparams = restore_run(run_dir)
  index = resolve_member(run_dir, member, config.population_size)
  take = lambda x: jax.numpy.asarray(x)[index]  # noqa: E731
  params = jax.tree.map(take, learner.policy_params(state))
  acting = jax.tree.map(take, driver.actor_hparams(hparams))
  return Policy(agent, params, acting, index, config.env, seed)


@dataclasses.dataclass
class Evaluation:
  """What ``evaluate`` returns."""

  member: int
  mean: float  # mean return over the episodes
  std: float  # their standard deviation (population std, ddof=0)
  returns: list  # each episode's return
  videos: list  # MP4 paths written (with video_dir)


def evaluate(run_dir: str, member: Member = 'best', episodes: int = 10,
             video_dir: Optional[str] = None, seed: int = 0) -> Evaluation:
  """Plays ``episodes`` episodes of ``member``'s evaluation policy.

  Episode ``k`` resets with the seed the run's own final evaluation gives
  member ``member``'s episode ``k`` (``evaluation.evaluation_seeds``): with
  ``seed`` set to the run's ``--seed`` and ``episodes`` to its
  ``--eval-episodes``, it replays the final evaluation.

  Args:
    video_dir: if given, every episode is recorded as an MP4 there by
      gymnasium's ``RecordVideo`` (needs ``pip install 'fastpbrl[video]'``,
      and for MuJoCo envs an OpenGL backend: ``MUJOCO_GL=egl`` headless).
  """
  if not isinstance(episodes, int) or episodes < 1:
    raise ConfigError(f'--episodes must be an integer >= 1, got {episodes!r}')
  import gymnasium as gym  # noqa: PLC0415

  from fastpbrl.envs import make_env  # noqa: PLC0415
  from fastpbrl.evaluation import evaluation_seeds  # noqa: PLC0415

  policy = load_policy(run_dir, member, seed)
  if video_dir is None:
    env = make_env(policy.env_id)
  else:
    try:
      import moviepy  # noqa: F401, PLC0415
    except ImportError:
      raise ConfigError("--video-dir needs MoviePy: pip install "
                        "'fastpbrl[video]'") from None
    try:
      env = make_env(policy.env_id, render_mode='rgb_array')
    except gym.error.Error as e:
      raise ConfigError(f'--video-dir: {policy.env_id} cannot render: '
                        f'{str(e).splitlines()[0]}') from None
    env = gym.wrappers.RecordVideo(
        env, video_dir, episode_trigger=lambda _: True,
        name_prefix=f'member_{policy.member:03d}', disable_logger=True)
  returns = []
  try:
    for reset_seed in evaluation_seeds(seed, policy.member, episodes):
      obs, _ = env.reset(seed=reset_seed)
      total, done = 0.0, False
      while not done:
        obs, reward, terminated, truncated, _ = env.step(policy(obs))
        total += float(reward)
        done = terminated or truncated
      returns.append(total)
  finally:
    env.close()
  videos = [] if video_dir is None else sorted(
      os.path.join(video_dir, f) for f in os.listdir(video_dir)
      if f.startswith(f'member_{policy.member:03d}') and f.endswith('.mp4'))
  return Evaluation(member=policy.member, mean=float(np.mean(returns)),
                    std=float(np.std(returns)), returns=returns, videos=videos)
