"""The implementations timed: one runner each (host-side).

Each runner builds its inputs (not timed), then ``call()`` runs one
population update call and waits for its results. The JAX runners call the
package's own programs (``PopulationLearner``, ``SharedCriticLearner``,
``agent.update``); the PyTorch ones the standard updates of
``benchmarks/torch_agents.py``.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import jax
import numpy as np

from benchmarks.update_speed.config import (ATARI_NUM_ACTIONS,
                                            HALF_CHEETAH_ACTION_DIM,
                                            HALF_CHEETAH_OBS_DIM, Case,
                                            available_cores, env_spec,
                                            iterations, make_agent,
                                            random_data)
from benchmarks.update_speed.measurements import (_jax_device_peak_bytes,
                                                  calls_per_sample, xla_flops)
from fastpbrl.agents import td3
from fastpbrl.core.types import random_transitions as random_batch
from fastpbrl.learner.population import (PopulationLearner, SharedCriticLearner,
                                         multi_step, population_hparams)


class _Runner:
  """Base: ``compile_s`` set by AOT runners; None where the first call
  compiles (it is then the first call's time minus a steady call's)."""

  compile_s: Optional[float] = None
  compiles_on_first_call = False
  flops_source = 'xla_cost_analysis'
  torch_threads: Optional[int] = None

  def call(self) -> None:
    raise NotImplementedError

  def flops_per_call(self) -> Optional[float]:
    raise NotImplementedError

  def device_peak_bytes(self) -> Optional[int]:
    return _jax_device_peak_bytes()


class _LearnerRunner(_Runner):
  """One call of a population learner on batches already on the device."""

  compiles_on_first_call = True

  def _setup(self, learner, hparams, agent, case: Case, n: int,
             seed: int) -> None:
    self.learner, self.hparams = learner, hparams
    # Scanned updates per call: steps, or a rollout agent's iterations.
    self.steps = iterations(agent, case.steps)
    self.state = learner.init(jax.random.PRNGKey(seed), hparams)
    self.batch = jax.device_put(random_data(agent, (n,), case.steps,
                                            case.batch_size, seed))
    jax.block_until_ready((self.state, self.batch))

  def call(self) -> None:
    self.state, metrics = self.learner.update(self.state, self.hparams,
                                              self.batch)
    jax.block_until_ready((self.state, metrics))

  def _flops(self, update_fn) -> Optional[float]:
    one_step = jax.tree.map(lambda x: x[:, 0], self.batch)
    flops = xla_flops(update_fn, self.state, self.hparams, one_step)
    return None if flops is None else flops * self.steps


class JaxVectorized(_LearnerRunner):
  """``PopulationLearner.update``: the project's one-program population call."""

  def __init__(self, case: Case, n: int, seed: int, cache: dict):
    del cache
    self.agent = make_agent(case.agent, case.steps, case.batch_size, case.hidden)
    self._setup(PopulationLearner(self.agent, case.steps),
                population_hparams(self.agent, n), self.agent, case, n, seed)

  def flops_per_call(self) -> Optional[float]:
    # A plain vmap: the delayed policy step counts on every step (an upper
    # bound; the learner's named vmap skips it where no member needs it).
    return self._flops(jax.vmap(self.agent.update))


class JaxSequential(_Runner):
  """A Python loop over members of the jitted single-member ``scan(update)``.

  The compiled program is the same for every N, so it is compiled once per
  sweep (ahead of time, which gives the compile time) and kept in ``cache``.
  """

  def __init__(self, case: Case, n: int, seed: int, cache: dict):
    agent = make_agent(case.agent, case.steps, case.batch_size, case.hidden)
    self.hparams = agent.default_hparams()
    if 'init' not in cache:
      cache['init'] = jax.jit(agent.init)
    keys = jax.random.split(jax.random.PRNGKey(seed), n)
    self.states = [cache['init'](k, self.hparams) for k in keys]
    self.batches = [jax.device_put(random_data(
        agent, (), case.steps, case.batch_size, seed + i)) for i in range(n)]
    scanned = iterations(agent, case.steps)  # a rollout agent's iterations
    jax.block_until_ready((self.states, self.batches))
    if 'step' not in cache:
      start = time.perf_counter()
      cache['step'] = jax.jit(multi_step(agent.update, scanned),
                              donate_argnums=0).lower(
                                  self.states[0], self.hparams,
                                  self.batches[0]).compile()
      cache['compile_s'] = time.perf_counter() - start
      one_step = jax.tree.map(lambda x: x[0], self.batches[0])
      flops = xla_flops(agent.update, self.states[0], self.hparams, one_step)
      cache['member_flops'] = None if flops is None else flops * scanned
    self.step = cache['step']
    self.compile_s = cache['compile_s']
    self.member_flops = cache['member_flops']

  def call(self) -> None:
    for i, batch in enumerate(self.batches):
      self.states[i], _ = self.step(self.states[i], self.hparams, batch)
    jax.block_until_ready(self.states)

  def flops_per_call(self) -> Optional[float]:
    if self.member_flops is None:
      return None
    return self.member_flops * len(self.states)


class SharedCriticVectorized(_LearnerRunner):
  """``SharedCriticLearner.update``: one critic step on the population-mean
  loss and all policy steps, vectorized (the paper's section 4.2)."""

  def __init__(self, case: Case, n: int, seed: int, cache: dict):
    del cache
    agent = make_agent(case.agent, case.steps, case.batch_size, case.hidden)
    self.shared = agent.shared_critic
    self._setup(SharedCriticLearner(self.shared, case.steps),
                population_hparams(agent, n), agent, case, n, seed)

  def flops_per_call(self) -> Optional[float]:
    return self._flops(self.shared.update)


class SharedCriticSequential(_Runner):
  """CEM-RL's order: at each update step, member after member, one critic
  step on that member's batch (with its target policy) then that member's
  delayed policy step, all against the one shared critic.

  Each (step, member) pair is one call of the jitted single-member TD3
  ``agent.update`` on a ``TD3State`` assembled from the shared critic and
  the member's policy: the same critic and policy steps as in TD3.
  """

  def __init__(self, case: Case, n: int, seed: int, cache: dict):
    agent = make_agent(case.agent, case.steps, case.batch_size, case.hidden)
    self.hparams = agent.default_hparams()
    if 'init' not in cache:
      cache['init'] = jax.jit(agent.init)
    keys = jax.random.split(jax.random.PRNGKey(seed), n)
    members = [cache['init'](k, self.hparams) for k in keys]
    self.critic = (members[0].critic, members[0].target_critic,
                   members[0].critic_opt)
    self.members = [(m.policy, m.target_policy, m.policy_opt, m.key, m.step)
                    for m in members]
    batches = [random_batch(agent.env_spec, (case.steps, case.batch_size),
                            seed + i) for i in range(n)]
    # Per-step slices put on the device beforehand: no slicing in the call.
    self.batches = [[jax.device_put(jax.tree.map(lambda x, s=s: x[s], b))
                     for s in range(case.steps)] for b in batches]
    jax.block_until_ready((self.critic, self.members, self.batches))

    def member_step(critic, member, hparams, batch):
      state = td3.TD3State(
          policy=member[0], critic=critic[0], target_policy=member[1],
          target_critic=critic[1], policy_opt=member[2],
          critic_opt=critic[2], key=member[3], step=member[4])
      state, _ = agent.update(state, hparams, batch)
      return ((state.critic, state.target_critic, state.critic_opt),
              (state.policy, state.target_policy, state.policy_opt, state.key,
               state.step))

    if 'step' not in cache:
      start = time.perf_counter()
      cache['step'] = jax.jit(member_step, donate_argnums=(0, 1)).lower(
          self.critic, self.members[0], self.hparams,
          self.batches[0][0]).compile()
      cache['compile_s'] = time.perf_counter() - start
      cache['member_step_flops'] = xla_flops(
          member_step, self.critic, self.members[0], self.hparams,
          self.batches[0][0])
    self.step = cache['step']
    self.compile_s = cache['compile_s']
    self.member_step_flops = cache['member_step_flops']
    self.steps = case.steps

  def call(self) -> None:
    for s in range(self.steps):
      for i in range(len(self.members)):
        self.critic, self.members[i] = self.step(
            self.critic, self.members[i], self.hparams, self.batches[i][s])
    jax.block_until_ready((self.critic, self.members))

  def flops_per_call(self) -> Optional[float]:
    if self.member_step_flops is None:
      return None
    return self.member_step_flops * self.steps * len(self.members)


class _SkipCase(Exception):
  """A whole sweep cannot run here (the message says why)."""


def torch_device() -> str:
  """The torch device matching the JAX backend, or raises ``_SkipCase``."""
  import torch  # pylint: disable=import-outside-toplevel
  backend = jax.default_backend()
  if backend == 'cpu':
    return 'cpu'
  if backend == 'gpu' and torch.cuda.is_available():
    return 'cuda'
  raise _SkipCase(
      f'torch has no device for the JAX backend {backend!r} '
      f'(torch {torch.__version__}, CUDA available: '
      f'{torch.cuda.is_available()}): comparing it on another device would '
      'be meaningless')


class _TorchRunner(_Runner):
  """Shared parts of the torch runners."""

  flops_source = 'torch_flop_counter'

  def _setup_torch(self, case: Case, threads: int, seed: int):
    import torch  # pylint: disable=import-outside-toplevel
    from benchmarks import torch_agents  # pylint: disable=import-outside-toplevel
    self.torch = torch
    self.torch_agents = torch_agents
    self.device = torch_device()
    torch.set_num_threads(threads)
    self.torch_threads = threads
    torch.manual_seed(seed)
    if self.device == 'cuda':
      torch.cuda.reset_peak_memory_stats()
    self.image = case.agent == 'dqn'
    spec = env_spec(case.agent)
    if self.image:
      self.dims = dict(num_actions=ATARI_NUM_ACTIONS)
    else:
      self.dims = dict(obs_dim=HALF_CHEETAH_OBS_DIM,
                       action_dim=HALF_CHEETAH_ACTION_DIM,
                       hidden=(case.hidden, case.hidden))
    if case.agent == 'ppo':
      self.dims['minibatch_size'] = case.batch_size
    # The fastpbrl agent, for the shapes of its inputs (nothing compiled).
    self.agent = make_agent(case.agent, case.steps, case.batch_size,
                            case.hidden)
    return spec

  def _sync(self) -> None:
    if self.device == 'cuda':
      self.torch.cuda.synchronize()

  def _count_flops(self, run: Callable[[], None], calls: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode  # pylint: disable=import-outside-toplevel
    counter = FlopCounterMode(display=False)
    with counter:
      for _ in range(calls):
        run()
    return counter.get_total_flops() / calls

  def device_peak_bytes(self) -> Optional[int]:
    if self.device == 'cuda':
      return int(self.torch.cuda.max_memory_allocated())
    return None


class TorchSequential(_TorchRunner):
  """Standard PyTorch updates, one member after another."""

  def __init__(self, case: Case, n: int, seed: int, cache: dict,
               threads: Optional[int] = None):
    del cache
    self._setup_torch(case, threads or available_cores(), seed)
    self.members = [self.torch_agents.make_agent(case.agent, device=self.device,
                                                 **self.dims)
                    for _ in range(n)]
    self.batches = []
    scanned = iterations(self.agent, case.steps)  # PPO: its iterations
    for i in range(n):
      batch = self.torch_agents.to_torch(
          random_data(self.agent, (), case.steps, case.batch_size, seed + i),
          self.device, self.image)
      self.batches.append([{k: v[s] for k, v in batch.items()}
                           for s in range(scanned)])
    self.steps = case.steps
    self._sync()

  def _run_member(self, i: int) -> None:
    for batch in self.batches[i]:
      self.members[i].update(batch)

  def call(self) -> None:
    for i in range(len(self.members)):
      self._run_member(i)
    self._sync()

  def flops_per_call(self) -> float:
    # One member's count times N: every member runs the same steps.
    calls = calls_per_sample(self.steps)
    return self._count_flops(lambda: self._run_member(0), calls) * len(
        self.members)


class TorchVectorized(_TorchRunner):
  """PyTorch with the members' layers stacked (batched matmuls, grouped
  convolutions): the paper's appendix C."""

  def __init__(self, case: Case, n: int, seed: int, cache: dict,
               threads: Optional[int] = None):
    del cache
    self._setup_torch(case, threads or available_cores(), seed)
    self.agent_name = case.agent
    self.population = self.torch_agents.make_agent(
        case.agent, device=self.device, population=n, **self.dims)
    batch = random_data(self.agent, (n,), case.steps, case.batch_size, seed)
    # Step axis first, so that each step's [N, B, ...] slice is contiguous.
    batch = jax.tree.map(lambda x: np.ascontiguousarray(np.swapaxes(x, 0, 1)),
                         batch)
    batch = self.torch_agents.to_torch(batch, self.device, self.image)
    self.batches = [{k: v[s] for k, v in batch.items()}
                    for s in range(iterations(self.agent, case.steps))]
    self.steps = case.steps
    self._sync()

  def _run(self) -> None:
    for batch in self.batches:
      self.population.update(batch)

  def call(self) -> None:
    self._run()
    self._sync()

  def flops_per_call(self) -> float:
    # torch's FlopCounterMode counts the backward of a grouped convolution as
    # if each group saw every group's channels (it grows as N^2; forward is
    # right). Count a one-member population instead and multiply by N: every
    # member does the same work.
    n = len(next(iter(self.batches[0].values())))
    single = self.torch_agents.make_agent(self.agent_name, device=self.device,
                                          population=1, **self.dims)
    batches = [{k: v[:1] for k, v in batch.items()} for batch in self.batches]

    def run_single():
      for batch in batches:
        single.update(batch)

    return self._count_flops(run_single, calls_per_sample(self.steps)) * n


RUNNERS = {
    ('independent', 'jax-vectorized'): JaxVectorized,
    ('independent', 'jax-sequential'): JaxSequential,
    ('independent', 'torch-sequential'): TorchSequential,
    ('independent', 'torch-vectorized'): TorchVectorized,
    ('shared-critic', 'jax-vectorized'): SharedCriticVectorized,
    ('shared-critic', 'jax-sequential'): SharedCriticSequential,
}
PARALLEL_MEMBER_RUNNERS = {'jax-parallel': JaxSequential,
                           'torch-parallel': TorchSequential}
