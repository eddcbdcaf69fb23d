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
from typing import Any, Mapping, Optional, Sequence, Union

import gymnasium as gym
import jax
import numpy as np

from fastpbrl.config.checks import check_types
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.config.saved import saved_config, saved_settings
from fastpbrl.datapath.evaluation import evaluation_seeds
from fastpbrl.devices import distributed
from fastpbrl.envs.gym import make_env
from fastpbrl.rules import registry
from fastpbrl.rules.base import Rule
from fastpbrl.run import build
from fastpbrl.run.callbacks import Callback
from fastpbrl.run.checkpoint import Checkpointer
from fastpbrl.run.finish import RunResult
from fastpbrl.run.main import run
from fastpbrl.run.resume import RULE_FORMAT, state_version
from fastpbrl.trained.policy import Policy
from fastpbrl.trained.run_data import best_member

Member = Union[str, int]


def rule_class(rule: Union[str, type]) -> type:
  """The registered rule class ``rule`` names (a ref, as on the command
  line) or is."""
  if isinstance(rule, type) and issubclass(rule, Rule):
    try:
      found = registry.get(registry.ref_of(rule))
    except ValueError:
      found = None
    if found is not rule:
      raise ConfigError(f'rule {rule.__qualname__} is not registered: '
                        'decorate it with @fastpbrl.rules.register')
    return rule
  try:
    return registry.get(rule)
  except ValueError as e:
    raise ConfigError(f'rule {e}') from None


@dataclasses.dataclass
class TrainResult:
  """What ``train`` returns."""

  run_dir: str
  best_member: int  # index of the member with the best final evaluation
  best_final_return: float  # its final evaluation's mean return
  checkpoint: str  # folder of the run's latest checkpoint (all members)
  # The events of the lineage its rule declares (``RuleOutputs.lineage``;
  # PBT's lineage.jsonl), in order; [] for a rule that declares none.
  lineage: list
  run: RunResult  # everything else: final returns, hparams, counters...


def train(rule: Union[str, type, None] = None, *,
          config: Optional[RunConfig] = None,
          callbacks: Sequence[Callback] = (),
          **config_fields: Any) -> TrainResult:
  """Trains a population with ``rule`` and returns where its best member is.

      fastpbrl.train('pbt', env='Hopper-v5', env_steps=50_000)
      fastpbrl.train(config=fastpbrl.PBTRunConfig(env='Hopper-v5'))
      fastpbrl.train(resume='runs/pbt-td3-Hopper-v5-...')  # a stopped run

  Args:
    rule: ``pbt`` (the default for a new run), ``cemrl``, ``dvd``,
      ``hypertrick``, ``seeds``, ``random``, a rule of your own as
      ``module:Class``, or its (registered) class. With ``resume`` it
      defaults to the run's own, with ``config`` to the rule whose config
      class it is.
    config: the settings as the rule's typed config (``PBTRunConfig``,
      ``RunConfig`` for ``seeds``, ...: the dataclasses the commands' flags
      come from); ``config_fields`` override it.
    callbacks: ``fastpbrl.Callback`` instances (``after_call(loop)``,
      ``after_rule_decision(loop, event)``).
    **config_fields: the rule's settings, named as the command's flags with
      ``_`` for ``-`` (``env_steps=600``, ``hidden_sizes=(16, 16)``,
      ``hparams={'policy_lr': 1e-3}`` for the agent's hyperparameters,
      ``agent_settings={'num_envs': 8}`` for its static config, ``search_space=
      {'policy_lr': {'kind': 'loguniform', 'low': 1e-4, 'high': 1e-3}}``
      for the rule's, as in a search-space file); the rest keep
      their defaults (``fastpbrl <rule> --help``). With
      ``resume=DIR`` the rest are the settings the run saved, as
      ``fastpbrl <rule> --resume DIR`` takes them.

  Raises:
    ConfigError: an unknown rule or setting, or an invalid value (the
      message names it as the flag: ``--env-steps must be > 0``); a
      ``SettingTypeError`` (a ``ConfigError`` and a ``TypeError``) for a
      value of the wrong type (``population_size='2'``, an env object).
  """
  resume = config_fields.get('resume') or getattr(config, 'resume', None)
  rule_cls = _train_rule(rule, config, resume)
  fields = _flag_values(rule_cls, config_fields)
  config = _train_config(rule_cls, config, resume, fields)
  # Before any JAX operation, joining processes included: one host device
  # per core on the device path.
  build.use_every_core(config)
  distributed.initialize_if_launched()  # under fastpbrl.launch or srun
  rule_obj = rule_cls.from_config(config)
  return _train_result(run(rule_obj.config, rule_obj, callbacks=callbacks))


def _train_rule(rule: Union[str, type, None], config: Optional[RunConfig],
                resume: Optional[str]) -> type:
  """``train``'s rule class: ``rule``, else the resumed run's, else the
  one ``config`` is for, else PBT's; checks that ``config`` (if any) is
  that rule's, and that it does not come with ``resume``."""
  if config is not None and resume:
    raise ConfigError('config and resume: a resume takes the run\'s saved '
                      'settings; pass changes as keyword arguments')
  if rule is None:
    rule = (saved_rule(resume) if resume else
            rule_of_config(config) if config is not None else 'pbt')
  rule_cls = rule_class(rule)
  config_cls = rule_cls.config_class
  if config is not None and not isinstance(config, config_cls):
    raise ConfigError(f'config is a {type(config).__name__}; rule '
                      f'{rule_cls.name} takes a {config_cls.__name__}')
  return rule_cls


def _flag_values(rule_cls: type, config_fields: Mapping[str, Any]) -> dict:
  """``train``'s keyword settings as the command's flags take them (numpy
  scalars as Python ones, mappings as the flags' text); a ``ConfigError``
  for a setting ``rule_cls``'s config does not have."""
  known = {f.name for f in dataclasses.fields(rule_cls.config_class)}
  unknown = sorted(set(config_fields) - known)
  if unknown:
    raise ConfigError(f'{rule_cls.name} has no setting {unknown[0]!r} '
                      f'(--{unknown[0].replace("_", "-")}); see fastpbrl '
                      f'{registry.ref_of(rule_cls)} --help')
  fields = {k: v.item() if isinstance(v, np.generic) else v
            for k, v in config_fields.items()}  # np.int64(2) -> 2
  if fields.get('hidden_sizes') is not None:
    fields['hidden_sizes'] = tuple(fields['hidden_sizes'])
  if isinstance(fields.get('agent_settings'), Mapping):
    # {'num_envs': 8, 'hidden_sizes': (64, 64)}: as --agent-settings takes it
    fields['agent_settings'] = tuple(
        f'{k}={",".join(map(str, v)) if isinstance(v, (tuple, list)) else v}'
        for k, v in fields['agent_settings'].items())
  if isinstance(fields.get('hparams'), Mapping):  # {'policy_lr': 1e-3}
    fields['hparams'] = tuple(
        f'{k}={v!r}' for k, v in fields['hparams'].items())
  if isinstance(fields.get('search_space'), Mapping):
    # {'policy_lr': {'kind': 'loguniform', 'low': 1e-4, 'high': 1e-3}}: as
    # --search-space takes it inline, so that config.json keeps it.
    fields['search_space'] = json.dumps(fields['search_space'])
  return fields


def _train_config(rule_cls: type, config: Optional[RunConfig],
                  resume: Optional[str], fields: dict) -> RunConfig:
  """The run's settings: the resumed run's saved ones, else ``config``,
  else the rule's defaults, with ``fields`` over them, type-checked."""
  config_cls = rule_cls.config_class
  if resume:  # what the command's --resume does: the saved settings
    base = saved_config(resume, config_cls())
  else:
    base = config if config is not None else config_cls()
  config = dataclasses.replace(base, **fields)
  check_types(config)
  return config


def _train_result(result: RunResult) -> TrainResult:
  """``train``'s result for the finished run ``result``: its best member
  and latest checkpoint, and the lineage its rule declares."""
  best = int(np.argmax(result.final_returns))
  read_lineage = registry.run_outputs(
      saved_settings(result.run_dir, flag='run folder')).lineage
  lineage = read_lineage(result.run_dir) if read_lineage else []
  return TrainResult(run_dir=result.run_dir, best_member=best,
                     best_final_return=float(result.final_returns[best]),
                     checkpoint=latest_checkpoint(result.run_dir),
                     lineage=lineage, run=result)


def rule_of_config(config: RunConfig) -> type:
  """The one registered rule whose config class ``config`` is."""
  rules = [rule for rule in registry.builtins()
           if type(config) is rule.config_class]
  if len(rules) != 1:
    raise ConfigError(f'no one rule takes a {type(config).__name__}: pass the '
                      'rule too, train(rule, config=...)')
  return rules[0]


def latest_checkpoint(run_dir: str) -> str:
  """The folder of ``run_dir``'s latest complete checkpoint."""
  checkpointer = Checkpointer(run_dir)
  try:
    step = checkpointer.latest_step()
  finally:
    checkpointer.close()
  if step is None:
    raise FileNotFoundError(f'{run_dir!r} holds no complete checkpoint')
  return os.path.join(checkpointer.directory, str(step))


def saved_rule(run_dir: str) -> str:
  """The ref of the rule that ran in ``run_dir`` (from its config.json)."""
  ref = saved_settings(run_dir, flag='run folder').get('rule')
  if ref is None:
    raise ConfigError(f'{run_dir!r}: its config.json names no rule (a run of '
                      'an earlier fastpbrl, which kept its rules\' state '
                      'another way)')
  return ref


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
  """Rebuilds ``run_dir``'s agent, learner and rule from its config.json
  and restores its latest checkpoint.

  Returns:
    ``(config, agent, rule, learner, state, hparams)``, the stacked
    training state and hyperparameters as the run last saved them.
  """
  rule_cls = rule_class(saved_rule(run_dir))
  # The folder is read, not written: no run-dir / resume checks.
  rule = rule_cls.from_config(dataclasses.replace(
      saved_config(run_dir, rule_cls.config_class()), run_dir=None,
      resume=None, progress=False))
  config = rule.config
  # Templates shaped as in ``run``: the restore overwrites every value.
  agent, learner, state, hparams, rule_state = build.assemble(rule)
  checkpointer = Checkpointer(run_dir)
  try:
    meta = checkpointer.restore_meta()
    if (meta.get('rule_format') != RULE_FORMAT
        or state_version(meta) != rule.state_version):
      raise ConfigError(f'{run_dir!r}: its checkpoint was written by an '
                        'earlier fastpbrl; it cannot be read by this one')
    state, extra, _ = checkpointer.restore(
        state, {'hparams': hparams, 'rule': rule_state})
  finally:
    checkpointer.close()
  return config, agent, rule, learner, state, extra['hparams']


def load_policy(run_dir: str, member: Member = 'best', seed: int = 0
                ) -> Policy:
  """The evaluation policy of ``member`` (``'best'`` or an index) of the
  run in ``run_dir``, from its latest checkpoint; or, given a file that
  ``Policy.save`` wrote, that policy.

  ``seed`` seeds the policy's own random draws (DQN's evaluation epsilon);
  TD3 and SAC act deterministically.
  """
  if os.path.isfile(run_dir):  # one member's policy, saved by Policy.save
    return Policy.load(run_dir, seed=seed)
  config, agent, rule, learner, state, hparams = restore_run(run_dir)
  index = resolve_member(run_dir, member, config.population_size)
  take = lambda x: jax.numpy.asarray(x)[index]  # noqa: E731
  params = jax.tree.map(take, learner.policy_params(state))
  acting = jax.tree.map(take, rule.actor_hparams(hparams))
  return Policy(agent, params, acting, index, config.env, seed,
                agent_ref=config.agent)


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
