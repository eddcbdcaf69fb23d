"""Standard PyTorch TD3, SAC, DQN and PPO updates: the baselines of the
update-speed benchmark (``benchmarks/update_speed/``).

Host-side benchmark code only: nothing in ``fastpbrl`` imports this module,
and this module is the only one that imports torch.

Each agent runs in one of two layouts, picked by ``population``:

* ``population=None``: ONE member, written the way the reference code is
  (Fujimoto's ``TD3.py``, Stable-Baselines3's SAC and DQN): ``nn.Linear``
  MLPs, the Nature CNN from ``nn.Conv2d``, ``torch.optim`` optimizers. The
  paper's *Torch (Sequential)* calls ``update`` for one member after another;
  *Torch (Parallel)* runs one such member per process.
* ``population=N``: *Torch (Vectorized)*, the 2022 paper's appendix C: the
  layers of ``N`` members are stacked on a leading axis, MLP layers run as one
  ``torch.baddbmm`` over ``[N, B, in] @ [N, in, out]`` and the convolutions as
  one grouped ``nn.Conv2d`` (``groups=N``). Every loss is the SUM over members
  of each member's batch mean, so each member gets exactly its own gradient,
  and Adam / RMSProp, being elementwise, then take the same step as ``N``
  separate optimizers (``stack_members`` and the tests check this).

As in the reference code, the policy loss back-propagates into the critic's
weights too (their gradients are zeroed before the next critic step); JAX
drops that unused work at compile time, PyTorch's eager autograd does not.
"""

from __future__ import annotations

import copy
import math
from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

Batch = dict  # name -> tensor: observation, action, reward, next_observation, terminated


class StackedLinear(nn.Module):
  """``N`` independent ``nn.Linear`` layers applied as one batched matmul.

  ``weight`` is ``[N, in, out]`` (transposed w.r.t. ``nn.Linear``) and
  ``bias`` ``[N, 1, out]``; the input is ``[N, B, in]``. Initialised like
  ``nn.Linear``: uniform in ``+-1/sqrt(in)`` for both.
  """

  def __init__(self, population: int, in_features: int, out_features: int):
    super().__init__()
    bound = 1.0 / math.sqrt(in_features)
    self.weight = nn.Parameter(
        torch.empty(population, in_features, out_features).uniform_(-bound, bound))
    self.bias = nn.Parameter(
        torch.empty(population, 1, out_features).uniform_(-bound, bound))

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return torch.baddbmm(self.bias, x, self.weight)


def mlp(sizes: Sequence[int], population: Optional[int],
        activation=nn.ReLU) -> nn.Sequential:
  """MLP ``sizes[0] -> ... -> sizes[-1]`` (ReLU between layers unless
  ``activation`` says otherwise), one member or ``N`` stacked."""
  layers = []
  for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
    layers.append(nn.Linear(n_in, n_out) if population is None
                  else StackedLinear(population, n_in, n_out))
    if i < len(sizes) - 2:
      layers.append(activation())
  return nn.Sequential(*layers)


class TwinCritic(nn.Module):
  """Two Q-networks on ``concat(obs, action)``; ``forward`` returns both."""

  def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int],
               population: Optional[int]):
    super().__init__()
    sizes = [obs_dim + action_dim, *hidden, 1]
    self.q1 = mlp(sizes, population)
    self.q2 = mlp(sizes, population)

  def forward(self, obs, action):
    x = torch.cat([obs, action], dim=-1)
    return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

  def first(self, obs, action):
    """Q1 only (TD3's policy loss)."""
    return self.q1(torch.cat([obs, action], dim=-1)).squeeze(-1)


class NatureCNN(nn.Module):
  """The Nature-DQN network on uint8 frames ``[B, 4, 84, 84]``.

  With ``population=N`` the input is ``[N, B, 4, 84, 84]``: members become
  channel groups (``[B, N*4, 84, 84]``) for three grouped convolutions, then
  ``StackedLinear`` layers on ``[N, B, 3136]``. Output ``[..., B, actions]``.
  """

  def __init__(self, num_actions: int, population: Optional[int]):
    super().__init__()
    self.population = population
    n = population or 1
    self.convs = nn.ModuleList([
        nn.Conv2d(4 * n, 32 * n, 8, stride=4, groups=n),
        nn.Conv2d(32 * n, 64 * n, 4, stride=2, groups=n),
        nn.Conv2d(64 * n, 64 * n, 3, stride=1, groups=n),
    ])
    self.head = mlp([64 * 7 * 7, 512, num_actions], population)

  def forward(self, frames: torch.Tensor) -> torch.Tensor:
    x = frames.float() / 255.0
    if self.population is not None:
      n, b = x.shape[:2]
      x = x.transpose(0, 1).reshape(b, n * x.shape[2], *x.shape[3:])
    for conv in self.convs:
      x = F.relu(conv(x))
    if self.population is None:
      x = x.flatten(1)
    else:
      x = x.reshape(x.shape[0], self.population, -1).transpose(0, 1)
    return self.head(x)


def _frozen_copy(module: nn.Module) -> nn.Module:
  target = copy.deepcopy(module)
  target.requires_grad_(False)
  return target


@torch.no_grad()
def _soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
  for t, p in zip(target.parameters(), online.parameters()):
    t.lerp_(p, tau)


class TorchAgent:
  """Common base: the member/population layout and the module list."""

  population: Optional[int]
  modules: tuple  # names of the nn.Module attributes, online and target

  def _loss(self, per_example: torch.Tensor) -> torch.Tensor:
    # Batch mean per member, summed over members: each member's gradient is
    # exactly the one it would get alone.
    return per_example.mean(dim=-1).sum()


class TD3(TorchAgent):
  """TD3 as in Fujimoto et al.'s reference ``TD3.py`` (256x256, Adam 3e-4)."""

  modules = ('actor', 'actor_target', 'critic', 'critic_target')

  def __init__(self, obs_dim: int, action_dim: int,
               hidden: Sequence[int] = (256, 256),
               population: Optional[int] = None, device: str = 'cpu',
               lr: float = 3e-4, discount: float = 0.99, tau: float = 0.005,
               policy_delay: int = 2, target_noise: float = 0.2,
               noise_clip: float = 0.5):
    self.population = population
    self.settings = dict(obs_dim=obs_dim, action_dim=action_dim,
                         hidden=tuple(hidden), device=device, lr=lr,
                         discount=discount, tau=tau, policy_delay=policy_delay,
                         target_noise=target_noise, noise_clip=noise_clip)
    self.actor = nn.Sequential(mlp([obs_dim, *hidden, action_dim], population),
                               nn.Tanh()).to(device)
    self.critic = TwinCritic(obs_dim, action_dim, hidden, population).to(device)
    self.actor_target = _frozen_copy(self.actor)
    self.critic_target = _frozen_copy(self.critic)
    self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=lr)
    self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=lr)
    self.discount, self.tau, self.policy_delay = discount, tau, policy_delay
    self.target_noise, self.noise_clip = target_noise, noise_clip
    self.step = 0

  def update(self, batch: Batch) -> None:
    """One TD3 gradient step (policy and targets every ``policy_delay``)."""
    obs, action = batch['observation'], batch['action']
    next_obs = batch['next_observation']
    with torch.no_grad():
      noise = (torch.randn_like(action) * self.target_noise).clamp(
          -self.noise_clip, self.noise_clip)
      next_action = (self.actor_target(next_obs) + noise).clamp(-1.0, 1.0)
      next_q1, next_q2 = self.critic_target(next_obs, next_action)
      target = batch['reward'] + self.discount * (
          1.0 - batch['terminated']) * torch.minimum(next_q1, next_q2)
    q1, q2 = self.critic(obs, action)
    critic_loss = (self._loss(torch.square(q1 - target))
                   + self._loss(torch.square(q2 - target)))
    self.critic_opt.zero_grad()
    critic_loss.backward()
    self.critic_opt.step()

    if self.step % self.policy_delay == 0:
      actor_loss = -self._loss(self.critic.first(obs, self.actor(obs)))
      self.actor_opt.zero_grad()
      actor_loss.backward()
      self.actor_opt.step()
      _soft_update(self.critic_target, self.critic, self.tau)
      _soft_update(self.actor_target, self.actor, self.tau)
    self.step += 1


class GaussianActor(nn.Module):
  """SAC actor: MLP to the mean and log-std (clipped to [-20, 2])."""

  def __init__(self, obs_dim, action_dim, hidden, population):
    super().__init__()
    self.net = mlp([obs_dim, *hidden, 2 * action_dim], population)

  def forward(self, obs):
    mean, log_std = self.net(obs).chunk(2, dim=-1)
    return mean, log_std.clamp(-20.0, 2.0)


def sample_tanh_gaussian(mean, log_std):
  """``a = tanh(u)``, ``u ~ N(mean, std)``; returns ``(a, log pi(a))``."""
  std = log_std.exp()
  u = mean + std * torch.randn_like(mean)
  gaussian_logp = (-0.5 * ((u - mean) / std) ** 2 - log_std
                   - 0.5 * math.log(2 * math.pi)).sum(-1)
  log_det = (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
  return torch.tanh(u), gaussian_logp - log_det


class SAC(TorchAgent):
  """SAC with a learned temperature, as in Stable-Baselines3 / the authors'
  v2 settings (256x256, Adam 3e-4, target entropy ``-dim(A)``)."""

  modules = ('actor', 'critic', 'critic_target')

  def __init__(self, obs_dim: int, action_dim: int,
               hidden: Sequence[int] = (256, 256),
               population: Optional[int] = None, device: str = 'cpu',
               lr: float = 3e-4, discount: float = 0.99, tau: float = 0.005):
    self.population = population
    self.settings = dict(obs_dim=obs_dim, action_dim=action_dim,
                         hidden=tuple(hidden), device=device, lr=lr,
                         discount=discount, tau=tau)
    self.actor = GaussianActor(obs_dim, action_dim, hidden, population).to(device)
    self.critic = TwinCritic(obs_dim, action_dim, hidden, population).to(device)
    self.critic_target = _frozen_copy(self.critic)
    # [N, 1] so that it broadcasts against per-example terms [N, B].
    shape = (1,) if population is None else (population, 1)
    self.log_alpha = torch.zeros(shape, device=device, requires_grad=True)
    self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=lr)
    self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=lr)
    self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=lr)
    self.target_entropy = -float(action_dim)
    self.discount, self.tau = discount, tau
    self.step = 0

  def update(self, batch: Batch) -> None:
    """One SAC step: critics, then actor, then temperature, then targets."""
    obs, next_obs = batch['observation'], batch['next_observation']
    alpha = self.log_alpha.detach().exp()
    with torch.no_grad():
      next_action, next_logp = sample_tanh_gaussian(*self.actor(next_obs))
      next_q1, next_q2 = self.critic_target(next_obs, next_action)
      soft_value = torch.minimum(next_q1, next_q2) - alpha * next_logp
      target = batch['reward'] + self.discount * (
          1.0 - batch['terminated']) * soft_value
    q1, q2 = self.critic(obs, batch['action'])
    critic_loss = 0.5 * (self._loss(torch.square(q1 - target))
                         + self._loss(torch.square(q2 - target)))
    self.critic_opt.zero_grad()
    critic_loss.backward()
    self.critic_opt.step()

    action, logp = sample_tanh_gaussian(*self.actor(obs))
    q1, q2 = self.critic(obs, action)
    actor_loss = self._loss(alpha * logp - torch.minimum(q1, q2))
    self.actor_opt.zero_grad()
    actor_loss.backward()
    self.actor_opt.step()

    alpha_loss = -self._loss(self.log_alpha * (logp.detach()
                                               + self.target_entropy))
    self.alpha_opt.zero_grad()
    alpha_loss.backward()
    self.alpha_opt.step()
    _soft_update(self.critic_target, self.critic, self.tau)
    self.step += 1


class DQN(TorchAgent):
  """Nature DQN: Huber loss, centred RMSProp (2.5e-4, 0.95, 0.01), target
  network copied every 2,500 updates, as in Stable-Baselines3's Atari zoo."""

  modules = ('online', 'target')

  def __init__(self, num_actions: int, population: Optional[int] = None,
               device: str = 'cpu', lr: float = 2.5e-4,
               discount: float = 0.99, target_update_period: int = 2500):
    self.population = population
    self.settings = dict(num_actions=num_actions, device=device, lr=lr,
                         discount=discount,
                         target_update_period=target_update_period)
    self.online = NatureCNN(num_actions, population).to(device)
    self.target = _frozen_copy(self.online)
    self.opt = torch.optim.RMSprop(self.online.parameters(), lr=lr, alpha=0.95,
                                   eps=0.01, centered=True)
    self.discount, self.target_update_period = discount, target_update_period
    self.step = 0

  def update(self, batch: Batch) -> None:
    """One DQN gradient step on the Huber TD error."""
    with torch.no_grad():
      next_q = self.target(batch['next_observation']).max(dim=-1).values
      target = batch['reward'] + self.discount * (
          1.0 - batch['terminated']) * next_q
    q = self.online(batch['observation'])
    q_taken = q.gather(-1, batch['action'].unsqueeze(-1)).squeeze(-1)
    loss = self._loss(F.smooth_l1_loss(q_taken, target, reduction='none'))
    self.opt.zero_grad()
    loss.backward()
    self.opt.step()
    self.step += 1
    if self.step % self.target_update_period == 0:
      self.target.load_state_dict(self.online.state_dict())


class PPO(TorchAgent):
  """Stable-Baselines3's PPO iteration (``PPO.train()`` after
  ``compute_returns_and_advantage``) on a continuous-action rollout:
  separate tanh MLPs for the Gaussian's mean and the value, a
  state-independent log-std, GAE through truncations (from ``V`` of the
  real next observation), ``epochs`` passes of shuffled minibatches, the
  clipped surrogate, value MSE and entropy bonus, the global-norm clip
  (per member when stacked), one Adam (eps 1e-5) over both networks.
  ``update`` is ONE iteration on a rollout ``[T, E, ...]`` (``[N, T, E,
  ...]`` stacked): what ``fastpbrl.agents.ppo``'s ``update`` does."""

  modules = ('policy', 'value')

  def __init__(self, obs_dim: int, action_dim: int,
               hidden: Sequence[int] = (64, 64),
               population: Optional[int] = None, device: str = 'cpu',
               minibatch_size: int = 64, epochs: int = 10,
               lr: float = 3e-4, clip_range: float = 0.2,
               ent_coef: float = 0.0, vf_coef: float = 0.5,
               gae_lambda: float = 0.95, discount: float = 0.99,
               max_grad_norm: float = 0.5):
    self.population = population
    self.settings = dict(
        obs_dim=obs_dim, action_dim=action_dim, hidden=tuple(hidden),
        device=device, minibatch_size=minibatch_size, epochs=epochs, lr=lr,
        clip_range=clip_range, ent_coef=ent_coef, vf_coef=vf_coef,
        gae_lambda=gae_lambda, discount=discount, max_grad_norm=max_grad_norm)
    self.policy = mlp([obs_dim, *hidden, action_dim], population,
                      nn.Tanh).to(device)
    self.value = mlp([obs_dim, *hidden, 1], population, nn.Tanh).to(device)
    shape = (action_dim,) if population is None else (population, 1,
                                                      action_dim)
    self.log_std = nn.Parameter(torch.zeros(shape, device=device))
    self.params = [*self.policy.parameters(), *self.value.parameters(),
                   self.log_std]
    self.opt = torch.optim.Adam(self.params, lr=lr, eps=1e-5)
    self.minibatch_size, self.epochs = minibatch_size, epochs
    self.clip_range, self.ent_coef, self.vf_coef = clip_range, ent_coef, vf_coef
    self.gae_lambda, self.discount = gae_lambda, discount
    self.max_grad_norm = max_grad_norm
    self.step = 0

  def _gae(self, batch: Batch, samples: int) -> tuple:
    """Flattened observations, actions, behaviour log-probs, advantages
    and returns, ``[(N,) T E, ...]``."""
    lead = batch['reward'].shape[:-2]  # () or (N,)
    steps, envs = batch['reward'].shape[-2:]
    flat = lambda x: x.reshape(*lead, samples, *x.shape[len(lead) + 2:])  # noqa: E731
    with torch.no_grad():
      obs = flat(batch['observation'])
      values = self.value(obs).squeeze(-1).reshape(batch['reward'].shape)
      next_values = self.value(flat(batch['next_observation'])).squeeze(
          -1).reshape(batch['reward'].shape)
      term = batch['terminated']
      done = torch.maximum(term, batch['truncated'])
      delta = (batch['reward'] + self.discount * (1.0 - term) * next_values
               - values)
      advantages = torch.zeros_like(delta)
      last = torch.zeros_like(delta[..., 0, :])
      for t in reversed(range(steps)):  # SB3's loop, over time
        last = delta[..., t, :] + self.discount * self.gae_lambda * (
            1.0 - done[..., t, :]) * last
        advantages[..., t, :] = last
      returns = advantages + values
    return (obs, flat(batch['action']), flat(batch['log_prob']),
            flat(advantages), flat(returns))

  def _clip_grads(self) -> None:
    if self.population is None:
      nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
      return
    # clip_grad_norm_ per member: each one's norm over its own slices.
    norms = torch.sqrt(sum(p.grad.pow(2).flatten(1).sum(1)
                           for p in self.params))
    scale = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
    for p in self.params:
      p.grad.mul_(scale.view(-1, *[1] * (p.dim() - 1)))

  def update(self, batch: Batch) -> None:
    """One PPO iteration on the rollout ``batch``."""
    steps, envs = batch['reward'].shape[-2:]
    samples = steps * envs
    obs, action, old_log_prob, advantages, returns = self._gae(batch, samples)
    device = obs.device
    for _ in range(self.epochs):
      if self.population is None:
        order = torch.randperm(samples, device=device)
      else:  # one permutation per member
        order = torch.argsort(torch.rand(self.population, samples,
                                         device=device), dim=1)
      for start in range(0, samples, self.minibatch_size):
        idx = order[..., start:start + self.minibatch_size]
        if self.population is None:
          take = lambda x, i=idx: x[i]  # noqa: E731
        else:
          rows = torch.arange(self.population, device=device)[:, None]
          take = lambda x, i=idx, r=rows: x[r, i]  # noqa: E731
        mb_obs, adv = take(obs), take(advantages)
        adv = (adv - adv.mean(-1, keepdim=True)) / (
            adv.std(-1, keepdim=True) + 1e-8)
        mean = self.policy(mb_obs)
        log_std = self.log_std.expand_as(mean)
        log_prob = (-0.5 * ((take(action) - mean) * torch.exp(-log_std)) ** 2
                    - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)
        ratio = torch.exp(log_prob - take(old_log_prob))
        surrogate = torch.minimum(
            adv * ratio, adv * ratio.clamp(1 - self.clip_range,
                                           1 + self.clip_range))
        value = self.value(mb_obs).squeeze(-1)
        loss = (-self._loss(surrogate)
                + self.vf_coef * self._loss((take(returns) - value) ** 2)
                - self.ent_coef * self._loss(entropy))
        self.opt.zero_grad()
        loss.backward()
        self._clip_grads()
        self.opt.step()
    self.step += 1


def make_agent(name: str, *, obs_dim: int = 0, action_dim: int = 0,
               num_actions: int = 0, hidden: Sequence[int] = (256, 256),
               population: Optional[int] = None,
               device: str = 'cpu', minibatch_size: int = 64) -> TorchAgent:
  """The torch agent ``name`` (``td3``, ``sac``, ``dqn`` or ``ppo``) in one
  layout (``minibatch_size``: PPO's)."""
  if name == 'ppo':
    return PPO(obs_dim, action_dim, hidden, population, device,
               minibatch_size=minibatch_size)
  if name == 'td3':
    return TD3(obs_dim, action_dim, hidden, population, device)
  if name == 'sac':
    return SAC(obs_dim, action_dim, hidden, population, device)
  if name == 'dqn':
    return DQN(num_actions, population, device)
  raise ValueError(f'unknown torch agent {name!r}; known: td3, sac, dqn, '
                   'ppo')


def to_torch(batch, device: str, image: bool) -> Batch:
  """A batch of numpy arrays (a ``Transition``, or a ``Rollout``: its
  ``truncated`` and ``log_prob`` too) as torch tensors on ``device``.

  Image observations ``[..., 84, 84, 4]`` become channels-first
  ``[..., 4, 84, 84]``; integer actions become int64 (what ``gather`` takes).
  """
  def obs(x):
    x = np.asarray(x)
    if image:
      x = np.ascontiguousarray(np.moveaxis(x, -1, -3))
    return torch.from_numpy(x).to(device)

  action = np.asarray(batch.action)
  action = action.astype(np.int64) if np.issubdtype(action.dtype, np.integer) \
      else action.astype(np.float32)
  out = {
      'observation': obs(batch.observation),
      'action': torch.from_numpy(action).to(device),
      'reward': torch.from_numpy(np.asarray(batch.reward, np.float32)).to(device),
      'next_observation': obs(batch.next_observation),
      'terminated': torch.from_numpy(
          np.asarray(batch.terminated, np.float32)).to(device),
  }
  if hasattr(batch, 'log_prob'):  # a Rollout
    for name in ('truncated', 'log_prob'):
      out[name] = torch.from_numpy(
          np.asarray(getattr(batch, name), np.float32)).to(device)
  return out


@torch.no_grad()
def stack_members(members: Sequence[TorchAgent]) -> TorchAgent:
  """A vectorized population holding the given members' current weights.

  Optimizer states start fresh, as the members' do before their first step;
  used by the tests to check that the vectorized layout takes exactly the
  members' own steps.
  """
  first = members[0]
  population = type(first)(**first.settings, population=len(members))
  for attr in first.modules:
    stacked = dict(getattr(population, attr).named_modules())
    singles = [dict(getattr(m, attr).named_modules()) for m in members]
    for name, module in stacked.items():
      parts = [s[name] for s in singles]
      if isinstance(module, StackedLinear):
        module.weight.copy_(torch.stack([p.weight.T for p in parts]))
        module.bias.copy_(torch.stack([p.bias[None] for p in parts]))
      elif isinstance(module, nn.Conv2d):
        module.weight.copy_(torch.cat([p.weight for p in parts]))
        module.bias.copy_(torch.cat([p.bias for p in parts]))
  if isinstance(first, SAC):
    population.log_alpha.copy_(torch.stack([m.log_alpha for m in members]))
  if isinstance(first, PPO):
    population.log_std.copy_(torch.stack([m.log_std[None] for m in members]))
  population.step = first.step
  return population
