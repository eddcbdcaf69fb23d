"""The actor pool: spawns actor processes, reads their chunks, watches them.

Host-side module (``multiprocessing`` with the spawn start method, threads,
shared memory; nothing here is jittable).

``N`` members are split into ``P`` contiguous, balanced groups, one actor
process per group (``P`` defaults to the available cores minus one, every
core for synchronous on-policy collection, and is at most ``N``). Each
process has its own :class:`~fastpbrl.actors.channel.Channel`; in the
learner process one reader thread per channel hands every chunk to a
``sink`` callback (the pipeline inserts it into the replay) and frees the
slot. A monitor thread checks every ``poll_s`` seconds that each
process is alive. When one dies the pool drains the chunks it completed,
reports an :class:`ActorFailure` (members, exit code, traceback), and either
restarts that actor (fresh seeds, same members, env-step counters carried
over) or, once ``max_restarts`` is used up, keeps the failure as fatal:
:meth:`ActorPool.check` then raises :class:`ActorDiedError`.

Shutdown (:meth:`ActorPool.close`) raises every channel's stop flag, joins the
processes (SIGKILL for any that do not exit within the grace period: actors
ignore SIGINT and SIGTERM, which the learner process handles), stops the threads and unlinks every segment. Actors also exit on
their own when the learner process dies, and ``close`` is registered to run
at interpreter exit.

Scripts that create a pool must guard their entry point with
``if __name__ == '__main__':``, as the spawn start method re-imports the main
module in every actor process.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
from acme import specs

from fastpbrl.actors.actor import ActorSpec, run_actor
from fastpbrl.actors.channel import Channel, chunk_layout
from fastpbrl.actors.param_store import ParamStore

logger = logging.getLogger(__name__)

Sink = Callable[[int, np.ndarray, Mapping[str, np.ndarray]], None]
# admit(members, steps, timeout) -> bool: may this chunk be handed over now?
Admit = Callable[[np.ndarray, int, float], bool]

# Exit status of a spawned actor process whose re-import of the parent's
# main script tried to start a run (no ``if __name__ == '__main__':``).
MISSING_MAIN_GUARD_EXIT = 86
MISSING_MAIN_GUARD = (
    "the script that started this run has no `if __name__ == '__main__':` "
    'guard: each actor process (spawn start method) re-imports it and would '
    'start a run of its own. Put the code that starts the run under '
    "`if __name__ == '__main__':`")


def exit_if_spawned_import(what: str) -> None:
  """Called where a run or a pool starts: inside an actor process that is
  still importing the parent's main script, exits at once with
  :data:`MISSING_MAIN_GUARD_EXIT` and one line on stderr, which the parent's
  pool turns into an :class:`ActorDiedError` naming the fix."""
  if getattr(mp.current_process(), '_inheriting', False):
    # ``_inheriting`` is multiprocessing's own flag for this (the check
    # behind its "bootstrapping phase" error).
    os.write(2, f'fastpbrl: {what} in a spawned actor process: '
                f'{MISSING_MAIN_GUARD}\n'.encode())
    os._exit(MISSING_MAIN_GUARD_EXIT)


def missing_main_guard() -> str | None:
  """In the parent, before anything starts: the problem (one line) when the
  main script calls this run from its top level outside an ``if __name__
  == '__main__':`` block, which every spawned actor process would re-run;
  else None. Only a main script that spawn re-imports counts (a file run
  as ``python script.py`` or a module run as ``python -m mod``); ``python
  -c``, a package's ``__main__`` (``python -m fastpbrl.cli.commands``,
  ``python -m pytest``), the console scripts (guarded) and notebooks pass."""
  main = sys.modules.get('__main__')
  spec_name = getattr(getattr(main, '__spec__', None), 'name', None)
  path = getattr(main, '__file__', None)
  # multiprocessing.spawn's rules for what the child re-runs.
  if (path is None or spec_name == '__main__'
      or (spec_name or '').endswith('.__main__')):
    return None
  frame = sys._getframe(1)  # noqa: SLF001
  while frame is not None and not (frame.f_globals is vars(main)
                                   and frame.f_code.co_name == '<module>'):
    frame = frame.f_back
  if frame is None:
    return None  # not called while the main script's top level runs
  try:
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read())
  except (OSError, SyntaxError, ValueError):
    return None
  line = frame.f_lineno
  for node in ast.walk(tree):
    if (isinstance(node, ast.If) and _is_main_test(node.test)
        and node.lineno <= line <= (node.end_lineno or node.lineno)):
      return None
  return (f'{os.path.basename(path)} starts the run at its top level (line '
          f'{line}) without `if __name__ == \'__main__\':`: each actor '
          'process re-imports the script and would start a run of its own; '
          "put the code that starts the run under "
          "`if __name__ == '__main__':`")


def _is_main_test(test: ast.expr) -> bool:
  """Whether ``test`` is ``__name__ == '__main__'`` (either way round)."""
  if not (isinstance(test, ast.Compare) and len(test.ops) == 1
          and isinstance(test.ops[0], ast.Eq)):
    return False
  sides = {ast.dump(test.left), ast.dump(test.comparators[0])}
  return sides == {ast.dump(ast.Name('__name__', ast.Load())),
                   ast.dump(ast.Constant('__main__'))}


class ActorFailure(NamedTuple):
  """One actor process that died without being asked to stop."""

  actor_id: int
  members: tuple[int, ...]
  pid: int
  exitcode: int | None  # negative: killed by that signal
  error: str  # the traceback the actor left, or how it died
  restarted: bool  # True if the pool started a replacement
  time: float  # time.time() when detected


class ActorDiedError(RuntimeError):
  """An actor died and was not (or could no longer be) restarted."""

  def __init__(self, failure: ActorFailure):
    self.failure = failure
    if failure.exitcode == MISSING_MAIN_GUARD_EXIT:
      super().__init__(MISSING_MAIN_GUARD)
      return
    super().__init__(
        f'actor {failure.actor_id} (members {list(failure.members)}, pid '
        f'{failure.pid}) died with exit code {failure.exitcode}:\n'
        f'{failure.error}')


class ActorStatus(NamedTuple):
  actor_id: int
  members: tuple[int, ...]
  pid: int | None
  alive: bool
  restarts: int
  chunks: int  # chunks committed by the current process
  pending: int  # chunks waiting in its channel
  heartbeat_age_s: float | None  # seconds since its last sign of life
  blocked_s: float  # seconds it waited on a full channel (backpressure)


def default_num_processes(num_members: int, on_policy: bool = False) -> int:
  """Actor processes by default, at least 1, at most N: the available
  cores minus one (the learner's) beside a learner that runs while the
  actors step (off-policy); every available core for synchronous on-policy
  collection, where the learner waits while the actors step and the actors
  wait while it learns (``fastpbrl.datapath.actor_rollouts``), so that a core kept
  for it would idle through every rollout."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count() or 2
  return max(1, min(num_members, cores if on_policy else cores - 1))


def split_members(num_members: int,
                  num_processes: int) -> list[tuple[int, ...]]:
  """Balanced contiguous groups: 5 members over 2 processes: (0,1,2), (3,4)."""
  if num_processes < 1 or num_processes > num_members:
    raise ValueError(f'num_processes must be in [1, {num_members}] '
                     f'(num_members); got {num_processes}')
  return [tuple(int(i) for i in group) for group in
          np.array_split(np.arange(num_members), num_processes)]


def check_picklable(value: Any, name: str) -> None:
  """Spawned processes receive their arguments pickled: fail early."""
  try:
    pickle.dumps(value)
  except Exception as e:
    raise ValueError(
        f'{name} must be picklable to reach spawned actor processes (use a '
        f'module-level function or functools.partial, not a lambda or a '
        f'closure); got {value!r}: {e}') from e


def _check_pool_args(num_members: int, chunk_steps: int, queue_chunks: int,
                     max_restarts: int, store: ParamStore, env_fn: Any,
                     agent_fn: Any) -> None:
  """Raises ValueError for the first of ``ActorPool``'s arguments that is
  out of range, and if a function would not reach the actor processes."""
  if num_members < 1:
    raise ValueError(f'num_members must be >= 1, got {num_members}')
  if chunk_steps < 1:
    raise ValueError(f'chunk_steps must be >= 1, got {chunk_steps}')
  if queue_chunks < 1:
    raise ValueError(f'queue_chunks must be >= 1, got {queue_chunks}')
  if max_restarts < 0:
    raise ValueError(f'max_restarts must be >= 0, got {max_restarts}')
  if store.num_members != num_members:
    raise ValueError(f'store holds {store.num_members} members, expected '
                     f'{num_members}')
  check_picklable(env_fn, 'env_fn')
  check_picklable(agent_fn, 'agent_fn')


class _Slot:
  """Bookkeeping of one actor (its current process, channel and reader)."""

  def __init__(self, actor_id: int, members: tuple[int, ...]):
    self.actor_id = actor_id
    self.members = members
    self.member_array = np.asarray(members, np.int64)
    self.restarts = 0
    self.process = None
    self.pid: int | None = None
    self.channel: Channel | None = None
    self.reader: threading.Thread | None = None
    self.retire = threading.Event()  # reader: drain, then exit
    self.failed = False
    self.hung = ''  # why the monitor killed its process, if it did


class ActorPool:
  """Actor processes for a population, with monitoring and restarts."""

  def __init__(self, *, env_fn: Callable[[], Any],
               agent_fn: Callable[[specs.EnvironmentSpec], Any],
               transition_fields: Mapping[str, tuple], num_members: int,
               store: ParamStore, sink: Sink, seed: int = 0,
               num_processes: int | None = None, chunk_steps: int = 32,
               queue_chunks: int = 8, warmup_steps: int | Sequence[int] = 0,
               eval_interval: int = 0, eval_episodes: int = 1,
               max_restarts: int = 3, prng_impl: str = 'threefry2x32',
               vectorized_envs: bool = True,
               poll_s: float = 0.2, shutdown_grace_s: float = 5.0,
               on_failure: Callable[[ActorFailure], None] | None = None,
               admit: Admit | None = None,
               initial_env_steps: int | Sequence[int] = 0,
               random_until: int | Sequence[int] | None = None,
               hang_timeout_s: float | None = 120.0,
               on_policy: bool = False):
    """Args:
      env_fn: picklable, builds one gymnasium environment.
      agent_fn: picklable, ``env_spec -> Agent``.
      transition_fields: per-transition field specs (replay's
        ``transition_fields(env_spec)``).
      num_members: population size ``N``.
      store: the param store (created by the caller, who publishes into it).
      sink: ``sink(actor_id, members[M], chunk_views)`` called in a reader
        thread for every chunk; it must copy what it keeps.
      seed: the run seed.
      num_processes: actor processes ``P`` in ``[1, N]`` (default:
        ``default_num_processes(N, on_policy)``).
      chunk_steps: env steps per member in one chunk, >= 1.
      queue_chunks: chunks each channel holds before its actor blocks, >= 1.
      warmup_steps: random-action env steps per member (int or ``N`` ints).
      eval_interval: training env steps between evaluations (0: none).
      eval_episodes: episodes per evaluation, >= 1.
      max_restarts: restarts allowed per actor before a death is fatal.
      prng_impl: ``jax.random`` implementation of exploration keys.
      vectorized_envs: each actor steps its envs as one vectorized batch
        where ``fastpbrl.actors.vector_envs`` has one (False: serially).
      poll_s: how often the monitor checks the processes.
      shutdown_grace_s: seconds actors get to exit before SIGKILL.
      on_failure: called (in the monitor thread) for every failure.
      admit: ``admit(members, steps, timeout) -> bool``, asked before each
        chunk is handed to ``sink``; while it answers False the chunk stays
        in its channel, which fills up and blocks its actor (the rate
        limiter's ``wait_to_insert``). Chunks of a dead actor and chunks
        drained at shutdown are handed over regardless.
      initial_env_steps: training env steps each member already collected
        (a resumed run): the actors' counters, and so their evaluation
        schedule and step-dependent exploration, continue from there.
      random_until: per member, the env step count below which its actor
        acts randomly (default ``warmup_steps``; a resumed run passes
        ``initial_env_steps``: no random warm-up).
      hang_timeout_s: an actor whose heartbeat is older than this (alive
        but not stepping, e.g. stuck in an env call) is killed and handled
        like a dead one; None: never. Actors beat while they step, while
        they wait on a full channel and while they wait for parameters.
      on_policy: the actors collect synchronous on-policy rollouts
        (``fastpbrl.actors.actor``'s on-policy mode): each chunk waits for
        a new policy version; ``transition_fields`` then has ``log_prob``.
    """
    exit_if_spawned_import('an actor pool was created')
    _check_pool_args(num_members, chunk_steps, queue_chunks, max_restarts,
                     store, env_fn, agent_fn)
    num_processes = (default_num_processes(num_members, on_policy)
                     if num_processes is None else int(num_processes))
    self.groups = split_members(num_members, num_processes)
    self.num_members = num_members
    self._set_actor_settings(
        env_fn=env_fn, agent_fn=agent_fn, transition_fields=transition_fields,
        seed=seed, chunk_steps=chunk_steps, queue_chunks=queue_chunks,
        warmup_steps=warmup_steps, random_until=random_until,
        eval_interval=eval_interval, eval_episodes=eval_episodes,
        prng_impl=prng_impl, vectorized_envs=vectorized_envs,
        hang_timeout_s=hang_timeout_s)
    self._on_policy = bool(on_policy)
    self._set_supervision(
        store=store, sink=sink, max_restarts=max_restarts, poll_s=poll_s,
        shutdown_grace_s=shutdown_grace_s, on_failure=on_failure, admit=admit)
    self._init_runtime_state(initial_env_steps)

  def _set_actor_settings(self, *, env_fn, agent_fn, transition_fields,
                          seed, chunk_steps, queue_chunks, warmup_steps,
                          random_until, eval_interval, eval_episodes,
                          prng_impl, vectorized_envs,
                          hang_timeout_s) -> None:
    """Keeps each actor's settings: what its ``ActorSpec`` is built from,
    and how long it may go without a heartbeat (see __init__)."""
    num_members = self.num_members
    warmup = np.broadcast_to(np.asarray(warmup_steps, np.int64),
                             (num_members,))
    self._env_fn = env_fn
    self._agent_fn = agent_fn
    self._fields = dict(transition_fields)
    self._seed = int(seed)
    self._chunk_steps = int(chunk_steps)
    self._queue_chunks = int(queue_chunks)
    self._warmup = warmup
    self._random_until = (warmup if random_until is None else np.broadcast_to(
        np.asarray(random_until, np.int64), (num_members,)))
    if hang_timeout_s is not None and hang_timeout_s <= 0:
      raise ValueError(f'hang_timeout_s must be None or > 0, got '
                       f'{hang_timeout_s}')
    self._hang_timeout_s = hang_timeout_s
    self._eval_interval = int(eval_interval)
    self._eval_episodes = int(eval_episodes)
    self._prng_impl = prng_impl
    self._vectorized_envs = bool(vectorized_envs)

  def _set_supervision(self, *, store, sink, max_restarts, poll_s,
                       shutdown_grace_s, on_failure, admit) -> None:
    """Keeps the settings of reading, watching and restarting actors (see
    __init__)."""
    self._store = store
    self._sink = sink
    self._max_restarts = int(max_restarts)
    self._poll_s = poll_s
    self._grace = shutdown_grace_s
    self._on_failure = on_failure
    self._admit = admit

  def _init_runtime_state(self, initial_env_steps) -> None:
    """Creates the slots, counters, locks and flags (nothing started yet)."""
    num_members = self.num_members
    self._ctx = mp.get_context('spawn')
    self._slots = [_Slot(i, g) for i, g in enumerate(self.groups)]
    self._env_steps = np.broadcast_to(
        np.asarray(initial_env_steps, np.int64), (num_members,)).copy()
    self._lock = threading.Lock()  # env-step counters
    self._slots_lock = threading.Lock()  # slot transitions vs status()
    self._stopping = threading.Event()
    self._fatal: ActorDiedError | None = None
    self._sink_error: BaseException | None = None
    self.failures: list[ActorFailure] = []
    self._monitor: threading.Thread | None = None
    self._started = False
    self._closed = False

  @property
  def num_processes(self) -> int:
    return len(self._slots)

  # ---------------------------------------------------------------- start

  def start(self) -> 'ActorPool':
    """Spawns every actor and the monitor thread (returns at once)."""
    if self._started:
      raise RuntimeError('the pool was already started')
    self._started = True
    # Before multiprocessing's own exit handler, which would SIGTERM the
    # daemonic actors (they ignore it) and then join them without a timeout.
    atexit.register(self.close)
    try:
      for slot in self._slots:
        self._launch(slot)
      self._monitor = threading.Thread(target=self._watch, daemon=True,
                                       name='fastpbrl-actor-monitor')
      self._monitor.start()
    except BaseException:
      self.close()
      raise
    return self

  def _launch(self, slot: _Slot) -> None:
    layout = chunk_layout(self._fields, len(slot.members), self._chunk_steps,
                          self._eval_episodes)
    channel = Channel.create(layout, self._queue_chunks, self._ctx)
    with self._lock:
      env_steps = tuple(int(x) for x in self._env_steps[slot.member_array])
    spec = ActorSpec(
        actor_id=slot.actor_id, members=slot.members, env_fn=self._env_fn,
        agent_fn=self._agent_fn, seed=self._seed, restart=slot.restarts,
        env_steps=env_steps,
        warmup_steps=tuple(int(self._warmup[i]) for i in slot.members),
        random_until=tuple(int(self._random_until[i]) for i in slot.members),
        eval_interval=self._eval_interval, eval_episodes=self._eval_episodes,
        prng_impl=self._prng_impl, vectorized_envs=self._vectorized_envs,
        params=self._store.handle,
        channel=channel.handle, parent_pid=os.getpid(),
        on_policy=self._on_policy)
    process = self._ctx.Process(
        target=run_actor, args=(spec,), daemon=True,
        name=f'fastpbrl-actor-{slot.actor_id}')
    try:
      # The process pins its JAX to one CPU thread itself, first thing
      # (``configure_actor_process``): no environment variable is changed
      # here, where other threads (the learner's JAX) may read them.
      process.start()
    except BaseException:
      channel.close()
      raise
    channel.release_producer_end()
    retire = threading.Event()
    reader = threading.Thread(
        target=self._read, args=(slot, channel, retire), daemon=True,
        name=f'fastpbrl-reader-{slot.actor_id}')
    with self._slots_lock:
      slot.channel, slot.process, slot.pid = channel, process, process.pid
      slot.retire, slot.reader, slot.failed = retire, reader, False
      slot.hung = ''
    reader.start()
    logger.info('actor %d (members %s) started, pid %d', slot.actor_id,
                list(slot.members), process.pid)

  # --------------------------------------------------------------- reader

  def _read(self, slot: _Slot, channel: Channel,
            retire: threading.Event) -> None:
    members = slot.member_array
    try:
      while True:
        retiring = retire.is_set()
        channel.wait(0.1)
        while True:
          chunk = channel.peek()
          if chunk is None:
            break
          if (not retiring and self._admit is not None and
              not self._admit(members, int(chunk['meta'][0]), 0.1)):
            chunk = None
            break  # held back; re-check retirement, then ask again
          self._sink(slot.actor_id, members, chunk)
          with self._lock:
            self._env_steps[members] = chunk['env_steps']
          chunk = None
          channel.release()
        if retiring:  # drained everything committed before retirement
          return
    except BaseException as e:  # e.g. the replay rejected a chunk
      logger.exception('reader of actor %d failed', slot.actor_id)
      self._sink_error = e

  # -------------------------------------------------------------- monitor

  def _watch(self) -> None:
    while not self._stopping.wait(self._poll_s):
      for slot in self._slots:
        if self._stopping.is_set():
          return
        process = slot.process
        if process is None or slot.failed:
          continue
        if process.is_alive():
          self._check_hung(slot)
          continue
        try:
          self._handle_death(slot)
        except BaseException as e:  # never let the monitor die silently
          logger.exception('handling the death of actor %d failed',
                           slot.actor_id)
          slot.failed = True
          self._fatal = self._fatal or ActorDiedError(ActorFailure(
              slot.actor_id, slot.members, slot.pid or -1, None,
              f'restart failed: {e!r}', False, time.time()))

  def _check_hung(self, slot: _Slot) -> None:
    """Kills an actor that is alive but has not beaten for
    ``hang_timeout_s``; the next poll handles it as a death (restart)."""
    channel = slot.channel
    if self._hang_timeout_s is None or channel is None or slot.hung:
      return
    beat = channel.heartbeat
    age = time.monotonic() - beat
    if not beat or age <= self._hang_timeout_s:
      return  # not started yet (importing), or alive and beating
    slot.hung = (f'actor {slot.actor_id} (members {list(slot.members)}, pid '
                 f'{slot.pid}) hung: no heartbeat for {age:.0f} s '
                 f'(hang_timeout_s={self._hang_timeout_s:g}); killed it')
    logger.error('%s', slot.hung)
    with contextlib.suppress(ProcessLookupError, ValueError):
      slot.process.kill()

  def _handle_death(self, slot: _Slot) -> None:
    process, channel = slot.process, slot.channel
    process.join(0)
    exitcode = process.exitcode
    error = channel.error_text() if channel is not None else ''
    if slot.hung:
      error = slot.hung + ('\n' + error if error else '')
    if exitcode == MISSING_MAIN_GUARD_EXIT and not error:
      error = MISSING_MAIN_GUARD
    if not error:
      if exitcode is not None and exitcode < 0:
        try:
          how = f'killed by {signal.Signals(-exitcode).name}'
        except ValueError:
          how = f'killed by signal {-exitcode}'
      else:
        how = f'exited with code {exitcode}'
      error = (f'actor {slot.actor_id} (members {list(slot.members)}, pid '
               f'{slot.pid}) {how} without leaving a traceback')
    with self._slots_lock:
      slot.failed = True
    # Keep every chunk it completed: the reader drains, then exits.
    slot.retire.set()
    if slot.reader is not None:
      slot.reader.join(10.0)
    with self._slots_lock:
      channel.close()
      process.close()
    restart = (slot.restarts < self._max_restarts
               and not self._stopping.is_set()
               and exitcode != MISSING_MAIN_GUARD_EXIT)  # would fail again
    failure = ActorFailure(slot.actor_id, slot.members, slot.pid,
                           exitcode, error, restart, time.time())
    with self._lock:
      self.failures.append(failure)
    logger.error('actor %d (members %s) died (exit code %s)%s:\n%s',
                 slot.actor_id, list(slot.members), exitcode,
                 '; restarting it' if restart else '; not restarting',
                 error)
    if self._on_failure is not None:
      self._on_failure(failure)
    if restart:
      slot.restarts += 1
      self._launch(slot)
    else:
      self._fatal = self._fatal or ActorDiedError(failure)

  # ---------------------------------------------------------------- state

  def check(self) -> None:
    """Raises the first fatal actor death or reader failure, if any."""
    if self._fatal is not None:
      raise self._fatal
    if self._sink_error is not None:
      raise RuntimeError(
          f'a chunk reader failed: {self._sink_error!r}') from self._sink_error

  @property
  def env_steps(self) -> np.ndarray:
    """``[N]`` training env steps received per member (a copy)."""
    with self._lock:
      return self._env_steps.copy()

  def pids(self) -> list[int | None]:
    """Process id of each actor's current (or last) process."""
    return [s.pid for s in self._slots]

  def status(self) -> list[ActorStatus]:
    """A snapshot of every actor (liveness, progress, backpressure)."""
    with self._slots_lock:
      return self._status()

  def _status(self) -> list[ActorStatus]:
    now = time.monotonic()
    out = []
    for slot in self._slots:
      process, channel = slot.process, slot.channel
      alive = process is not None and not slot.failed and process.is_alive()
      if channel is not None and not slot.failed:
        beat = channel.heartbeat
        out.append(ActorStatus(
            slot.actor_id, slot.members, slot.pid, alive, slot.restarts,
            channel.committed, channel.pending(),
            now - beat if beat else None, channel.blocked_s))
      else:
        out.append(ActorStatus(slot.actor_id, slot.members, slot.pid, False,
                               slot.restarts, 0, 0, None, 0.0))
    return out

  def describe_status(self) -> str:
    lines = []
    for s in self.status():
      age = 'never' if s.heartbeat_age_s is None else (
          f'{s.heartbeat_age_s:.1f} s ago')
      lines.append(
          f'  actor {s.actor_id} members {list(s.members)} pid {s.pid} '
          f'{"alive" if s.alive else "NOT RUNNING"}, restarts {s.restarts}, '
          f'chunks {s.chunks}, pending {s.pending}, last heartbeat {age}, '
          f'blocked {s.blocked_s:.1f} s')
    return '\n'.join(lines)

  # ------------------------------------------------------------- shutdown

  def close(self) -> None:
    """Stops every actor and thread and unlinks every segment (idempotent)."""
    if self._closed:
      return
    self._closed = True
    atexit.unregister(self.close)
    self._stopping.set()
    monitor = self._monitor
    if monitor is not None and monitor is not threading.current_thread():
      monitor.join(15.0)
    for slot in self._slots:
      if slot.channel is not None and not slot.failed:
        slot.channel.request_stop()
    deadline = time.monotonic() + self._grace
    processes = [s.process for s in self._slots
                 if s.process is not None and not s.failed]
    for p in processes:
      p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
      if p.is_alive():  # actors ignore SIGTERM (see run_actor): SIGKILL
        logger.warning('actor pid %d did not stop within %.1f s; killing it',
                       p.pid, self._grace)
        p.kill()
        p.join(5.0)
    for slot in self._slots:
      slot.retire.set()
    for slot in self._slots:
      if slot.reader is not None:
        slot.reader.join(5.0)
      if slot.channel is not None and not slot.failed:
        slot.channel.close()
      if slot.process is not None and not slot.failed:
        with contextlib.suppress(ValueError):
          slot.process.close()

  def __enter__(self) -> 'ActorPool':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
