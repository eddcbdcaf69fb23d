"""The PBT driver between learner calls (no pipeline: a stand-in loop):
a member is ready only once an evaluation of the policy it trained since
its last decision has come in, however fast its update steps pass."""

import dataclasses
import types

import jax
import numpy as np

from fastpbrl.actors.actor import EpisodeRecord
from fastpbrl.population import search_space as ss
from fastpbrl.rules.pbt import PBTDriver, PBTRunConfig
from fastpbrl.run import make_agent, make_env_spec

N = 4


def _start(tmp_path):
  config = PBTRunConfig(env='Pendulum-v1', population_size=N,
                        hidden_sizes=(8, 8), batch_size=4, steps_per_call=10,
                        env_steps=10_000, warmup_steps=100, ready_after=20,
                        eval_every=20, fraction=0.25)
  driver = PBTDriver(config)
  agent = make_agent(config, make_env_spec(config.env))
  learner = driver.make_learner(agent, 1)
  key = jax.random.PRNGKey(0)
  hparams = driver.initial_hparams(key, agent, N)
  state = driver.initialize(key, learner.init(key, hparams), agent)
  pipeline = types.SimpleNamespace(policy_version=1, wait_published=lambda: None)
  loop = types.SimpleNamespace(update_steps=0, env_steps=100, episodes=[],
                               state=state, hparams=hparams, run_dir=str(tmp_path),
                               pipeline=pipeline, key=jax.random.PRNGKey(1))
  loop.next_key = lambda: jax.random.split(loop.key)[1]
  return driver, loop


def _call(driver, loop, update_steps, evaluations=(), started_under=None):
  """One learner call's bookkeeping: ``evaluations`` are (member, return)
  pairs of evaluations that started under ``started_under``."""
  loop.update_steps += update_steps
  version = loop.pipeline.policy_version if started_under is None else \
      started_under
  loop.episodes = [EpisodeRecord(m, float(r), 200, True, loop.env_steps,
                                 version, start_policy_version=version)
                   for m, r in evaluations]
  driver.after_call(loop)
  loop.pipeline.policy_version += 1  # this call's weights are published


def test_no_exploit_on_evaluations_of_untrained_policies(tmp_path):
  driver, loop = _start(tmp_path)
  # Right after the warm-up the limiter grants its burst: one call holds
  # far more than --ready-after update steps, and the only evaluations are
  # the warm-up's, of the initial policies (version 1).
  _call(driver, loop, 200, [(0, -900.0), (1, -100.0), (2, -900.0),
                            (3, -900.0)], started_under=1)
  assert driver.exploits == 0 and not driver.evaluated.any()
  # Still no evaluation of a trained policy: no decision, however many steps.
  _call(driver, loop, 200)
  assert driver.exploits == 0
  # Evaluations of trained policies come in: now PBT decides.
  _call(driver, loop, 10, [(0, -900.0), (1, -100.0), (2, -500.0),
                           (3, -400.0)])
  assert driver.exploits == 1  # the bottom 25%, member 0, copies member 1
  assert not driver.evaluated.any()
  # The next decision waits for evaluations that start after this one.
  _call(driver, loop, 50, [(m, -100.0) for m in range(N)],
        started_under=loop.pipeline.policy_version - 1)
  assert driver.exploits == 1


def test_the_whole_population_decides_at_once(tmp_path):
  driver, loop = _start(tmp_path)
  _call(driver, loop, 200)  # the first call: warm-up evaluations score nobody
  # Members 0 and 1 are evaluated first; member 0 is the worst so far, but
  # nobody decides before every member has an evaluation.
  _call(driver, loop, 30, [(0, -900.0), (1, -100.0)])
  assert driver.exploits == 0 and driver.evaluated[:2].all()
  _call(driver, loop, 10, [(2, -50.0)])
  assert driver.exploits == 0
  # Member 3 comes in last and is the worst: the one decision replaces it
  # (the bottom 25% of four) by the best, member 2.
  assert driver.take_events() == []
  _call(driver, loop, 10, [(3, -1000.0)])
  events = driver.take_events()
  assert driver.exploits == 1
  assert [(e['member'], e['parent']) for e in events] == [(3, 2)]
  assert not driver.evaluated.any()


def test_explore_resamples_where_the_population_started(tmp_path):
  driver, loop = _start(tmp_path)
  near = ss.near(driver.space, make_agent(
      driver.config, make_env_spec(driver.config.env)).default_hparams())
  assert driver.exploit.resample_space == near
  prior = PBTDriver(dataclasses.replace(driver.config, init_hparams='prior'))
  agent = make_agent(prior.config, make_env_spec(prior.config.env))
  prior.initial_hparams(jax.random.PRNGKey(0), agent, N)
  assert prior.exploit.resample_space is None  # the whole search space
