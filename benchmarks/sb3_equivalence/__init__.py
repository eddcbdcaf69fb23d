"""Our TD3, SAC and PPO updates against Stable-Baselines3's, step by
step, from the same weights on the same batches and noise (needs the
``.[torch]`` extra).

The learning benchmark's ``sb3-td3`` reference is ahead of our TD3 baseline
on Hopper-v5 over the last fifth of the budget (within seed noise), and
``sync-td3`` (our agent in SB3's synchronous loop) is too. This script
splits the agent from everything else: it copies one member's initial
parameters (policy, both critics, their targets; SAC's temperature) into an
SB3 model, feeds both the same sequence of batches (transitions from the
task's environment under random actions) and the same random normals (ours,
handed to SB3's draws), and after update steps prints the largest relative
difference of every parameter group and of the critic loss. TD3: twin
critics, clipped double-Q target with clipped smoothing noise, termination
mask, Adam, the delayed policy and target steps, Polyak averaging. SAC: the
tanh-Gaussian policy's samples and log-probabilities, the soft target, the
temperature's loss and step, and the order of the three steps.

By default both sides compute in float64, so that the comparison is
exact: in float32 a difference at rounding level (1e-7) grows to a few
percent of the weights within 500 Hopper-v5 updates, for two runs of *our*
update as much as for ours against SB3's (Adam turns rounding-level
gradients into full-size steps), and then says nothing about the method.
``--perturb 1e-7`` shows that growth in float64: SB3 starts from our
weights changed at float32's rounding level.

SAC's one known difference: SB3 adds 1e-6 inside ``log(1 - tanh(u)^2)``
(``SquashedDiagGaussianDistribution.epsilon``), where ours uses the exact
stable form; the check sets SB3's to ``--sb3-epsilon`` (default 0, so the
rest is compared exactly; 1e-6 shows what it changes).

    python -m benchmarks.sb3_equivalence --agent td3 --env Hopper-v5 --steps 1000
    python -m benchmarks.sb3_equivalence --agent sac --env Hopper-v5 --steps 1000
    python -m benchmarks.sb3_equivalence --agent ppo --env Pendulum-v1 --iterations 3
    python -m benchmarks.sb3_equivalence --agent ppo --env Pendulum-v1 \
        --normalize-observations --normalize-rewards

PPO (``on_policy``) compares whole iterations: each one collects a
rollout of ``--rollout-length`` steps in ``--num-envs`` envs with OUR
member's ``behave``, then runs our ``update`` on it and SB3's
``PPO.train()`` on SB3's ``RolloutBuffer`` filled as SB3's
``collect_rollouts`` fills it (SB3's own values and log-probabilities of
those observations and actions, its timeout bootstrap ``r + gamma
V(terminal obs)`` at truncations, its episode starts) and its
``compute_returns_and_advantage``. SB3 shuffles with
``np.random.permutation``; the check hands it our epochs' permutations
(``fastpbrl.agents.ppo.minibatch_order``), mapped from our time-major
flattening of ``[T, E]`` to its env-major one. Compared after each
iteration: every layer of policy and value, the log-std, and the
iteration's mean policy, value and entropy losses, clip fraction and
explained variance (SB3's ``approx_kl`` is the last epoch's mean, ours
the iteration's: not compared). Works for discrete and continuous
actions.

``--normalize-observations`` and ``--normalize-rewards`` turn on our
member's ``VecNormalize`` equivalents and put SB3's ``VecNormalize``
(prior count set to ours, 0) on its side. Rewards: SB3's own
``VecNormalize.step_wait``, replaying the rollout's rewards and episode
ends step by step, scales the rewards SB3's buffer gets (before its
timeout bootstrap, as in ``collect_rollouts``); its ``ret_rms`` and
``returns`` are compared with our member's after each iteration.
Observations: our member updates the statistics at the end of each
iteration (a documented departure from VecNormalize's per-step update),
so SB3's ``obs_rms`` is updated likewise, with ``RunningMeanStd.update``
on the rollout's raw observations, and the buffer's observations and
terminal observations are normalised with VecNormalize's formula under
the statistics the rollout was collected with; SB3's ``obs_rms`` is
compared with ours. In float64, SB3's float32 cast of normalised
observations and rewards is skipped (its formulas are used without it).

Exit status 1 if any difference exceeds ``--tolerance``.

The package: ``cli`` (the flags; ``python -m benchmarks.sb3_equivalence``),
``weights`` (our parameters against SB3's modules, and the set-up both
checks share), ``off_policy`` (TD3 and SAC, update by update) and
``on_policy`` (PPO, iteration by iteration).
"""
