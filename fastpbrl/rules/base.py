"""The rule contract: what a population rule is, and what it may do
(host-side; the array work inside a rule may be jitted).

A rule decides, between learner calls, what happens to the population:
which members copy which, new hyperparameters, members restarted as new
experiments. It is a config plus pure functions, as an agent is
(``fastpbrl/agents/base.py``):

    rule = MyRule(config)                             # checks; holds no state
    rule.prepare(agent)                               # compiles what it runs
    hparams = rule.initial_hparams(key, agent, N)
    rule_state, state = rule.init(rule_key, Population(agent, state, hparams, key))
    # after every learner call:
    rule_state, decision = rule.decide(rule_state, observation)

The run loop (``fastpbrl.run.loop``) builds the ``Observation`` (counters, the
episodes that finished in this call, the stacked state and
hyperparameters, the data path's queries) and applies the ``Decision``
(new state and hyperparameters, replay copies, restarts, events for the
callbacks, lines for the run's logs). A rule never touches the loop, the
pipeline or the learner: what it needs played (an evaluation, probe
states) it asks through ``Observation.data``. Everything it remembers
lives in ``rule_state``: a ``NamedTuple`` of fixed-shape arrays (and
nested NamedTuples of them) with a ``key``
field, the rule's PRNG key. Checkpointing a rule is checkpointing that
pytree: a resume reads it back into the shapes ``init`` gives.

``decide`` must be a function of its arguments: the same ``rule_state``
and ``observation`` give the same decision, and it changes nothing it was
given (it returns new values; ``self`` holds only the settings and, from
``prepare``, functions compiled for the run's agent). That is
what makes a rule's decisions reproducible from a seed, identical in every
process of a multi-process run (each decides from the same gathered
observation), and testable without a run: build an ``Observation``, call
``decide``, look at the ``Decision``.

Over several processes (``fastpbrl.launch``) ``observation.state`` and
``observation.hparams`` are global arrays of which each process holds only
its own members' rows: jitted functions take them as they are, and a
value the host needs (a hyperparameter, a step counter) is read with
``fastpbrl.devices.sharding.whole_value``, which gathers it (``np.asarray`` would
refuse). A rule that cannot run there sets ``multi_process = False``.

To add a rule: subclass ``Rule`` in a file of your own, give it a ``name``,
a ``config_class`` (a ``fastpbrl.config.RunConfig`` subclass: its fields
are the command's flags) and ``presets``, override what it needs, and decorate it
with ``fastpbrl.rules.register``. ``fastpbrl mymod:MyRule --help`` then
lists its flags, and runs it, checkpoints and resumes it like the built-in
rules (``examples/halving.py`` is one).

What a rule leaves in the run folder beyond the generic files (episodes,
``hparams.csv``, ``rule.csv``) it declares in ``Rule.outputs()``, a
``RuleOutputs``: the files its decisions append to, the tables
``fastpbrl.load_run`` reads from them, a lineage of weight copies (the
family-tree picture, ``RunData.hparam_schedule``, ``TrainResult.lineage``)
and pictures of its own. Generic code reads a finished run through that
declaration (the run folder's ``config.json`` names the rule) and knows no
rule's files by name.

To test a rule without a run, ``fastpbrl.rules.testing.Harness`` drives it
through observations and carries out each ``Decision`` as the loop does
(``apply_decision`` below is the part both share).
"""

from __future__ import annotations

import types
from typing import (Any, Callable, ClassVar, Mapping, NamedTuple, Optional,
                    Protocol, Sequence)

import jax
import numpy as np

from fastpbrl.actors.pool import exit_if_spawned_import, missing_main_guard
from fastpbrl.config.checks import validate
from fastpbrl.config.derived import resolved
from fastpbrl.config.errors import ConfigError, check
from fastpbrl.config.fields import RunConfig
from fastpbrl.core import search_space as ss
from fastpbrl.devices.sharding import whole_value
from fastpbrl.learner.population import (PopulationLearner, SharedCriticLearner,
                                         population_hparams)


class Population(NamedTuple):
  """The freshly initialised population ``Rule.init`` sees."""

  agent: Any  # fastpbrl.agents.base.Agent
  state: Any  # stacked training state [N, ...]
  hparams: Any  # stacked hyperparameters [N]
  key: jax.Array  # for whatever ``init`` changes in ``state``


class DataQueries(Protocol):
  """What a rule may ask of the run's data path (``Observation.data``):
  episodes of policies the population does not act with, and states to
  probe policies on. The loop hands the run's data path
  (``fastpbrl.datapath.factory``, whichever runs: gymnasium actors or JAX envs on
  the device); a test or a replay hands a fake."""

  def evaluate(self, policy_params: Any, actor_hparams: Any, episodes: int,
               seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(returns, lengths)``, ``[K, episodes]`` each: noise-free episodes
    of the ``K`` stacked policies ``policy_params`` (whole in every
    process, not a population's rows), acting with ``actor_hparams``
    (``[K]``), policy ``k``'s resets seeded as member ``k``'s evaluations
    of ``seed`` (``fastpbrl.datapath.evaluation.evaluation_seeds``). Every process
    calls it at the same point and gets the same values."""

  def random_states(self, num_states: int, seed: int) -> np.ndarray:
    """``[num_states, *obs]`` float32 observations visited by uniformly
    random actions from resets seeded by ``seed``: the same states for the
    same env and seed."""


class Observation(NamedTuple):
  """What a rule may read after a learner call.

  ``episodes`` are the episodes that finished during this call
  (``fastpbrl.core.types.EpisodeRecord``: ``member``, ``episode_return``,
  ``episode_length``, ``evaluation``, ``env_steps``, ``policy_version``,
  ``start_policy_version``, ``true_objective``; read them as attributes,
  or per member with ``fastpbrl.rules.common.evaluation_returns``),
  without those that started under weights a ``Decision`` has since
  replaced (``renewed``). Versions number the policies the actors act
  with, from 1 at the start of a run or a resume. ``data`` answers the
  queries a rule may put to the data path (``DataQueries``; None where
  nothing can answer them).
  """

  calls: int  # learner calls done
  update_steps: int  # update steps per member (the population's count)
  member_update_steps: np.ndarray  # [N] update steps each member kept
  env_steps: int  # env steps per member (the least over members)
  episodes: tuple  # this call's finished EpisodeRecords (see above)
  marked_at: np.ndarray  # [N] policy version at each member's last ``mark``
  state: Any  # stacked training state (read it, never change it)
  hparams: Any  # stacked hyperparameters
  data: Optional[DataQueries] = None  # the data path's queries (see above)


class Decision(NamedTuple):
  """What the loop must do after a rule's ``decide``; ``Decision()`` is
  "nothing". Masks are ``[N]`` bool numpy arrays (``None``: no member)."""

  state: Any = None  # the new stacked training state, or None (unchanged)
  hparams: Any = None  # the new stacked hyperparameters, or None
  # Members whose weights changed: their episodes that started before the
  # new weights reach the actors are left out of later observations.
  renewed: Optional[np.ndarray] = None
  # Members whose ``Observation.marked_at`` becomes the policy version now
  # acted with (a rule that waits for an evaluation started after this
  # decision compares each episode's ``start_policy_version`` with it).
  mark: Optional[np.ndarray] = None
  # ``(members, sources)``: replay rows of member ``sources[k]`` are copied
  # into member ``members[k]`` (per-member replay; PBT's --copy-replay).
  copy_data: Optional[tuple] = None
  # Members started as new experiments: their replay emptied, their own
  # random warm-up again, no update steps until it is over.
  restart: Optional[np.ndarray] = None
  # ``(mask, key)``: members given fresh parameters and optimizer states
  # (``learner.reinit_members``, after ``state`` and ``hparams`` above).
  reinit: Optional[tuple] = None
  # One dict per decision, each with ``'event'``, ``'step'`` (update
  # steps) and ``'env_steps'``: handed to ``Callback.after_rule_decision``.
  events: tuple = ()
  # ``(file name, row dict)`` lines appended to the run's files (``.jsonl``:
  # one JSON object per line; ``.csv``: a header from the first row's
  # keys); each process writes its own copy. List the names in
  # ``Rule.log_files``, so a resume cuts them back to the checkpoint.
  logs: tuple = ()
  note: str = ''  # what was done, for the run's log (``replace_diverged``)


class RuleOutputs(NamedTuple):
  """What a rule's runs leave for readers of the run folder
  (``Rule.outputs``); ``RuleOutputs()`` is "nothing of its own".

  Each reader takes the run folder and must accept a folder the rule
  wrote nothing to yet (a run stopped early): it returns an empty result
  there. Readers run on the host, after or beside the run.
  """

  # The files its decisions append to (``Decision.logs``); a resume cuts
  # them back to the checkpoint. The default ``Rule.outputs`` declares
  # ``Rule.log_files`` here: keep that the one place that names them.
  files: tuple = ()
  # ``{name: read(run_dir) -> DataFrame or list}``: the rule's tables,
  # ``fastpbrl.load_run(run_dir).tables[name]``. A table named
  # ``'lineage'`` is also ``RunData.lineage``.
  tables: Mapping[str, Callable[[str], Any]] = types.MappingProxyType({})
  # ``read(run_dir) -> [event dict]``: the weight copies between members,
  # in the lineage format of ``fastpbrl.rules.pbt.lineage`` (``init`` /
  # ``reset`` / ``exploit`` events with ``step``, ``member``, ``parent``,
  # hyperparameters), oldest first. Declaring it gives ``lineage.png`` (the
  # family tree), exploit arrows on ``hparams.png``,
  # ``RunData.lineage_events`` and ``TrainResult.lineage``.
  lineage: Optional[Callable[[str], list]] = None
  # ``schedule(events, member) -> [(update_step, {hparam: value})]``: the
  # hyperparameters behind ``member``'s weights, following the lineage's
  # copies back (``RunData.hparam_schedule``; None: the member's own rows).
  schedule: Optional[Callable[[list, int], list]] = None
  # ``draw(run_dir) -> path or None``: pictures of its own, drawn by
  # ``fastpbrl.run.plots.plot_run`` at the end of a run after the generic ones.
  pictures: Sequence[Callable[[str], Optional[str]]] = ()


class RuleState(NamedTuple):
  """The state of a rule with no bookkeeping: only its key."""

  key: jax.Array


def split_key(rule_state):
  """``(rule_state with a new key, a fresh subkey)``."""
  key, sub = jax.random.split(rule_state.key)
  return rule_state._replace(key=key), sub


def mask(values, population_size: int) -> np.ndarray:
  """``[N]`` bool numpy array from a mask or from member indices."""
  out = np.zeros((population_size,), bool)
  values = np.asarray(values)
  if values.dtype == bool:
    out[:] = values
  else:
    out[values.astype(np.int64)] = True
  return out


class Rule:
  """A population rule. This base is the rule of independent members
  (many seeds): nothing happens between learner calls.

  Class attributes a rule sets:
    name: the command (``fastpbrl <name>``) and the run folder's prefix.
    help: one line for ``fastpbrl --help``.
    config_class: its settings, a ``RunConfig`` subclass (its fields are
      the command's flags); an instance's settings are ``rule.config``.
    presets: ``{name: config}`` for ``--preset``, the first the default.
    shared_critic: train through the agent's shared-critic update.
    shared_replay: one replay buffer for all members, always (a rule whose
      update needs it); for the others ``--shared-replay`` asks for one
      (``shares_replay``).
    min_population: the least --population-size it works with.
    multi_process: runs over several processes (``fastpbrl.launch``).
    log_files: the files its decisions append to (``Decision.logs``);
      the default ``outputs()`` declares them (``RuleOutputs.files``).
    not_resumable: why a killed run of it cannot be continued with
      ``--resume`` ('' : it can).
    command: for a rule built by another one's ``from_config`` (not
      registered itself), that rule's name: its runs are that command's.
    state_version: the layout of its rule state in a checkpoint; raise it
      when a release changes that layout, and ``--resume`` refuses a
      checkpoint of another layout with a message instead of a shape
      error.

  Attributes a rule may set in ``__init__``:
    space: the ``fastpbrl.core.search_space.SearchSpace`` its members'
      hyperparameters are drawn from (``--search-space``, else the agent's
      registered one); the end-of-run pictures mark the fields it draws
      log-uniformly. None (the default): a rule that draws none; the
      pictures then read the space back from the run's ``config.json``
      (``fastpbrl.run.plots.saved_log_fields``).
  """

  name: ClassVar[str] = ''
  help: ClassVar[str] = ''
  config_class: ClassVar[type] = RunConfig
  presets: ClassVar[Mapping[str, RunConfig]] = {}
  shared_critic: ClassVar[bool] = False
  shared_replay: ClassVar[bool] = False
  min_population: ClassVar[int] = 1
  multi_process: ClassVar[bool] = True
  log_files: ClassVar[tuple] = ()
  not_resumable: ClassVar[str] = ''
  command: ClassVar[str] = ''
  state_version: ClassVar[int] = 1
  space: Optional[ss.SearchSpace] = None

  def __init__(self, config: RunConfig):
    """Checks ``config`` (``ConfigError`` naming the flag) and keeps it;
    a rule keeps nothing else, and never changes it."""
    exit_if_spawned_import(f'a {self.name} rule was created')
    problem = missing_main_guard()
    check(problem is None, problem or '')
    config = resolved(config)
    validate(config, self.min_population)
    self.config = config

  def shares_replay(self) -> bool:
    """Whether the run keeps one replay for all members: always for a rule
    that needs it (``shared_replay``), else where ``--shared-replay``
    asks. A shared replay cannot empty one member's data, so a rule that
    restarts members (``Decision.restart``) refuses the flag."""
    return self.shared_replay or self.config.shared_replay

  @classmethod
  def from_config(cls, config: RunConfig) -> 'Rule':
    """The rule a command's parsed ``config`` asks for (``cls(config)``;
    a rule may hand another, as ``fastpbrl pbt --rerun-lineage`` does)."""
    return cls(config)

  def multi_process_problem(self, config: RunConfig,
                            where: str) -> Optional[str]:
    """What of this rule's settings in ``config`` does not work ``where``
    (``'over 2 processes'``): one line naming the flag, or None."""
    del config, where
    return None

  # The learner and the initial population.

  def prepare(self, agent) -> None:
    """Compiles what this rule's decisions run for ``agent`` (a rule runs
    with one agent); checks the settings that need the agent. The only
    attributes a rule sets after ``__init__``: never bookkeeping."""
    del agent

  def make_learner(self, agent, num_steps: int, mesh=None,
                   batch_size: Optional[int] = None):
    """The learner; ``mesh`` (``fastpbrl.devices.sharding``, None: one device)
    splits the population over devices; ``batch_size`` (default: the
    agent's) is what a call samples from a device replay."""
    if self.shared_critic:
      if agent.shared_critic is None:
        raise ConfigError(f'{self.name} needs an agent with a shared-critic '
                          f'update (td3); --agent {agent.name} has none')
      return SharedCriticLearner(self.shared_critic_update(agent), num_steps,
                                 batch_size or agent.config.batch_size,
                                 mesh=mesh)
    return PopulationLearner(agent, num_steps, batch_size, mesh=mesh)

  def shared_critic_update(self, agent):
    """The shared-critic update (``shared_critic`` rules)."""
    return agent.shared_critic

  def initial_hparams(self, key: jax.Array, agent, population_size: int):
    """The stacked hyperparameters of the initial population."""
    del key
    return population_hparams(agent, population_size)

  def init(self, key: jax.Array, population: Population):
    """``(rule_state, state)``: the rule's initial bookkeeping, with
    ``key`` as its PRNG key, and the initial training state (may differ
    from ``population.state``). Also called before a resume, whose restore
    then overwrites both: it gives the shapes."""
    return RuleState(key=key), population.state

  # Between learner calls.

  def decide(self, rule_state, observation: Observation):
    """``(rule_state, Decision)`` after one learner call."""
    del observation
    return rule_state, Decision()

  def replace_diverged(self, rule_state, observation: Observation,
                       diverged: np.ndarray):
    """``(rule_state, Decision)`` replacing the members flagged in
    ``diverged`` (``[N]`` bool), whose losses or parameters became NaN or
    infinite in a learner call (the learner kept their previous state).
    This default re-initialises them (fresh parameters and optimizer
    states, same hyperparameters)."""
    del observation
    rule_state, key = split_key(rule_state)
    return rule_state, Decision(reinit=(diverged, key),
                                renewed=diverged, note='re-initialised')

  def resumed(self, rule_state):
    """The restored ``rule_state`` of a resumed run, whose policy versions
    count from 1 again and whose first episodes are a new warm-up."""
    return rule_state

  def finished(self, rule_state) -> bool:
    """The rule has nothing left to do (besides the env-step budget)."""
    del rule_state
    return False

  # What the run reports.

  @classmethod
  def outputs(cls) -> RuleOutputs:
    """What its runs leave in the run folder for readers (``load_run``,
    ``plot_run``, ``train``'s result): a class method, as a run folder is
    read without the run's settings. Override it as
    ``super().outputs()._replace(tables=..., lineage=...)``, so that
    ``files`` stays ``log_files``."""
    return RuleOutputs(files=tuple(cls.log_files))

  def actor_hparams(self, hparams):
    """The agent hyperparameters actors act with (exploration noise)."""
    return hparams

  def hparam_rows(self, hparams) -> list[dict]:
    """Per-member hyperparameters as dicts, for logs and summaries."""
    return hparam_rows(hparams)

  def scalars(self, rule_state) -> dict:
    """The rule's scalars for the logs (``rule/<name>``)."""
    del rule_state
    return {}

  def summary(self, rule_state, run_dir: str) -> str:
    """Lines for the end-of-run summary ('' for none)."""
    del rule_state, run_dir
    return ''


def hparam_rows(hparams) -> list[dict]:
  """Per-member hyperparameters as ``[{name: float}]`` (gathered over
  processes)."""
  arrays = {k: whole_value(v) for k, v in hparams._asdict().items()}
  n = len(next(iter(arrays.values())))
  return [{k: float(v[i]) for k, v in arrays.items()} for i in range(n)]


def apply_decision(decision: Decision, state, hparams, *, reinit_members,
                   copy_data, restart, published_version, first_version,
                   marked_at):
  """Carries out ``decision``: the part of the loop's ``apply`` that a
  test harness (``fastpbrl.rules.testing``) does alike. Returns the new
  ``(state, hparams)``; ``first_version`` and ``marked_at`` (``[N]``) are
  updated in place. The data path comes in as functions:

  Args:
    reinit_members: ``(key, state, hparams, mask) -> state``
      (``learner.reinit_members``).
    copy_data: ``(members, sources) -> None``, replay rows of
      ``sources[k]`` into ``members[k]``.
    restart: ``(mask) -> None``, members started as new experiments.
    published_version: ``() -> int``, the policy version acted with once
      everything submitted is published (called only for ``renewed`` or
      ``mark``).
  """
  if decision.state is not None:
    state = decision.state
  if decision.hparams is not None:
    hparams = decision.hparams
  if decision.reinit is not None:  # with the new hyperparameters
    members, key = decision.reinit
    state = reinit_members(key, state, hparams, members)
  if decision.copy_data is not None:
    copy_data(*decision.copy_data)
  if decision.restart is not None and decision.restart.any():
    restart(decision.restart)  # an empty replay, its own warm-up
  if decision.renewed is not None or decision.mark is not None:
    version = published_version()
    if decision.renewed is not None:  # the first version with new weights
      first_version[decision.renewed] = version + 1
    if decision.mark is not None:
      marked_at[decision.mark] = version
  return state, hparams
