"""Learning benchmark: each population rule against N default seeds.

For every task of the suite, every method and every benchmark seed, one run
at a fixed env-step budget per member; then a table (per task and method:
the best member's final evaluation and the population's mean final
evaluation, mean and spread over seeds, wall time) and a plot of the best
member's evaluation return against env steps per member.

Methods:

* ``seeds-td3``, ``seeds-sac``: the baseline, ``--population-size``
  independent members at the agent's published defaults
  (``experiments.seeds``): what N default runs give at once;
* ``seeds-td3-no-catch-up``: the TD3 baseline with
  ``--no-warmup-counts-as-data``: updates start at zero when the warm-up
  ends, one per env step after it, as in the reference TD3 and SB3 loops,
  where the default lets the learner catch up right after the warm-up on
  its random-action data;
* ``seeds-td3-no-catch-up-low-lag``: the same with ``--steps-per-call 10``,
  so the actors act with a policy fewer update steps old (a policy is
  published after each learner call, and the actors run at most
  ``(prefetch depth + 2) x steps per call + 32`` env steps ahead of the
  learner): the policy-lag half of the comparison with SB3's synchronous
  loop;
* ``pbt-td3``, ``pbt-sac``: PBT over the same number of members;
  ``pbt-ttest-td3``: PBT whose exploit is Jaderberg et al.'s T-test
  selection (a member copies the one it drew only where Welch's test
  separates their returns), which keeps lineages apart while their
  returns are within noise of each other; ``pbt-no-copy-td3``: PBT's whole
  path (its rule, decisions and lineage log) with every member at the
  defaults and no copy (``--min-gap-absolute 1e9``), so that it differs
  from the baseline only in the path, never in what it decides: a gap
  between it and ``seeds-td3`` is the path's, a gap between it and
  ``pbt-td3`` the decisions';
* ``cemrl``: CEM-RL (its score is the CEM mean policy's return, reported in
  its own column; the members' finals are reported like the others');
* ``dvd``, ``dvd-no-diversity``: DvD-TD3 and the same shared-critic TD3
  with the diversity weight fixed at 0 (the diversity figure compares them);
  ``dvd-best-round``: DvD-TD3 whose lambda bandit scores a round by its
  best evaluation episode instead of the population mean;
  ``dvd-relative-gain``: DvD-TD3 whose bandit rewards a round's gain above
  the recent median gain instead of the paper's improvement;
  ``dvd-sigma-0.3``: DvD-TD3 with the kernel length scale 0.3 instead of
  1, so the term relaxes once members act about as far apart as freshly
  initialised policies do;
* ``hypertrick``: HyperTrick's search over the same slots;
* ``random-td3``, ``random-ppo``: random search from the prior, PBT's
  control arm in Jaderberg et al. 2017 (``experiments.random``): each
  member's hyperparameters drawn once from the agent's search space, the
  draws ``pbt --init-hparams prior`` starts from, and never changed; its
  baseline is ``seeds-<agent>``, and its final values give the share at
  the edges that draws alone put there;
* ``sync-td3``: our TD3 agent in a plain synchronous loop (one env step
  per member, then one update, from the warm-up's end; no actor
  processes, rate limiter or prefetch), to tell a gap to SB3 in the data
  path from one in the agent;
* ``sb3-td3``, ``sb3-sac`` (``.[torch]`` extra, which installs
  Stable-Baselines3): the single-agent reference, one SB3 agent per member
  slot with the same seeds, budget, warm-up, network sizes and evaluation
  episodes as the baseline, so "best of N SB3 seeds" is comparable to "best
  of N of our seeds";
* ``sb3-td3-own-defaults``: SB3's TD3 with SB3's own defaults, to tell a gap
  in the implementation from one in the settings;
* ``seeds-ppo``, ``pbt-ppo``, ``pbt-pb2-ppo``: on-policy members (PPO at
  Stable-Baselines3's defaults), through the actors on gymnasium tasks and
  on the device on JAX ones; ``sb3-ppo``: SB3's PPO at the same defaults,
  one agent per member slot, as ``sb3-td3``. A method whose agent cannot
  act in a task (TD3 on CartPole's discrete actions) is skipped there;
* ``random-ppo``, ``pbt-prior-ppo``, ``pbt-pb2-prior-ppo``,
  ``pbt-resample-prior-ppo``: random search from the prior, and PBT, PB2
  and PBT with resampling started from the same prior draws.

The report ends with the papers' comparison at larger populations
(``population_summary``): per cell of ``POPULATION_CELLS``, PBT and PB2
from the same prior against random search and against default seeds, a
sentence per task on what wins and the goal's line; then the same for
PBT and PB2 from near the defaults, and for PBT with resampling from the
same prior on the 16-member cells.

Every result lands in ``--out`` as one JSON per run
(``runs/<task>/<method>/seed<k>.json``), so an interrupted benchmark
continues where it stopped (existing results are kept unless ``--redo``;
a result that a later fix superseded is run again, and moved to
``superseded/`` beside it rather than overwritten); ``report`` rebuilds
the table and plot from them. Each run's own folder
(logs, TensorBoard events, per-member returns) is kept for inspection in a
new folder under ``--run-root`` (default: the system's temporary
directory); nothing there is needed by the table.

Usage::

  python -m benchmarks.learning                          # the whole suite
  python -m benchmarks.learning --tasks Pendulum-v1 --methods seeds-td3 pbt-td3 --seeds 0 1
  python -m benchmarks.learning --report-only

Host-side code: subprocesses, files, the table and the plot. Each run is a
fresh process (``python -m benchmarks.learning --one ...``), so one run's
actors, memory and JIT caches never touch the next.

The package, one job a module, each importing only those above it:

* ``suite``: the tasks, their budgets and the methods (what is run);
* ``store``: where a run's result file lives, which fixes supersede it,
  and reading the results back;
* ``references``: the single-agent references (Stable-Baselines3's agents,
  and our agent in a synchronous loop);
* ``runs``: one run of a method, recorded as a result file;
* ``tables``: the statistics over seeds and the cells they are built of;
* ``matrix``: PBT's variants against default seeds on the TD3 matrix;
* ``population``: the papers' comparison with random search;
* ``report``: ``results.md``, ``results.csv`` and ``learning.png``;
* ``cli``: the command line (``python -m benchmarks.learning``).
"""
