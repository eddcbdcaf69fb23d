"""configure_actor_process: the XLA flags an actor process starts with."""

import os
import subprocess
import sys

import pytest

from fastpbrl.actors.actor import ACTOR_XLA_FLAGS

PROBE = ('import os, jax, jax.numpy as jnp; '
         'from fastpbrl.actors.actor import configure_actor_process; '
         'configure_actor_process(); '
         'assert float(jax.jit(lambda x: x + 1)(jnp.ones(()))) == 2; '
         'print(os.environ["XLA_FLAGS"])')


def _flags_in_actor(xla_flags):
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  if xla_flags is not None:
    env['XLA_FLAGS'] = xla_flags
  done = subprocess.run([sys.executable, '-c', PROBE], env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  return done.stdout.strip().splitlines()[-1].split()


@pytest.mark.parametrize('user', [None, '--xla_force_host_platform_device_count=2'])
def test_every_flag_is_a_flag_and_comes_before_the_users(user):
  # XLA reads no flag after a word that is none, so every word is a
  # --flag=value, ours first; XLA started with them (the probe computed).
  words = _flags_in_actor(user)
  assert all(w.startswith('--') and '=' in w for w in words)
  assert words[:len(ACTOR_XLA_FLAGS)] == [f'{n}={v}' for n, v in
                                         ACTOR_XLA_FLAGS]
  assert words[len(ACTOR_XLA_FLAGS):] == ([] if user is None else [user])


def test_a_flag_the_user_set_is_kept():
  mine = '--xla_cpu_enable_concurrency_optimized_scheduler=true'
  words = _flags_in_actor(mine)
  assert mine in words
  assert '--xla_cpu_enable_concurrency_optimized_scheduler=false' not in words
  assert '--xla_cpu_multi_thread_eigen=false' in words
