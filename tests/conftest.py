"""Test-wide settings: CPU only, quiet MuJoCo deprecation chatter, XLA's
CPU code generation at optimisation level 0, and one JAX compilation cache
for the whole test session.

Most of the suite's time is XLA compilation, and many tests (and the actor
and worker processes they start) compile the same programs: the same small
TD3 learner and policy on Pendulum-v1, over and over. JAX's persistent
compilation cache (``JAX_COMPILATION_CACHE_DIR``) lets every process of the
session after the first load such a program instead of compiling it again.
The folder is new for each session: the process that starts the session
(pytest, or the pytest-xdist controller, which loads this file before it
starts its workers) makes it and removes it when the session ends. The
workers and every process the tests start inherit the variables, so they
share it, and no test ever loads a program compiled by another version of
the code. A folder set by the caller is used as it is and kept.

``--xla_backend_optimization_level=0`` (in ``XLA_FLAGS``, which the workers
and the processes the tests start inherit as well) turns off LLVM's
optimisation of the machine code XLA emits for the CPU: what a program
computes is the same (the tests compare with tolerances where float
rounding may differ), it compiles faster (CPU time 29 s against 89 s for
``tests/agents/test_learner_from_replay.py`` under load, 6.2 min against
9.4 min for ``tests/agents`` and ``tests/experiments`` idle) and runs
somewhat slower, which the suite's small sizes do not notice. Runs and
benchmarks keep XLA's default. A level the caller set in ``XLA_FLAGS`` is
kept. A test whose run time outweighs its compile time (the Pong run of
``tests/test_envs.py``, whose evaluations play whole games through a CNN:
216 s of CPU at level 0, 38 s at the default) starts its run in a process
of its own without the flag.

``FASTPBRL_CPU_DEVICES=1``: a run on the device path gives JAX one host
device per core when it starts first in its process
(``fastpbrl.devices.cores``); in a pytest worker, whether a test's run
starts JAX first depends on the order the tests ran in. One device keeps
every test's run the same in any order; the tests of the default
(``tests/devices/test_cores.py``) clear the variable in the processes they
start, and tests that want several devices set ``XLA_FLAGS`` as before.
"""

import os
import shutil
import tempfile
import warnings

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_backend_optimization_level=0').strip()
os.environ.setdefault('FASTPBRL_CPU_DEVICES', '1')
warnings.filterwarnings('ignore', message='.*settotalmass.*')

# Workers inherit the variable from the process that set it, so only that
# process owns (and removes) the folder.
_OWN_CACHE = 'JAX_COMPILATION_CACHE_DIR' not in os.environ
if _OWN_CACHE:
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(
      prefix='fastpbrl-tests-jax-cache-')
  # Cache every program, not only those that took a second or more to
  # compile: most of the suite's are small, and there are many of them.
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')


def pytest_sessionfinish(session):
  del session
  if _OWN_CACHE:
    shutil.rmtree(os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)
