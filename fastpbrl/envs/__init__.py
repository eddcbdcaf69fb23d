"""Environments: gymnasium ids made ready (``gym``), environments written in
JAX and the registry of their families (``jax_envs``; the built-in
families ``gymnax_envs`` and ``brax_envs``), environment parameters
searched beside hyperparameters (``params``) and the shaped example task
(``shaping``, also the example of a family).

``register``, ``JaxEnv`` and ``spec_of`` (``fastpbrl.envs.jax_envs``) are
imported on first use (PEP 562), so that importing this package imports
nothing of JAX: ``@fastpbrl.envs.register('mytask')`` on a function
``make(env_id, name) -> JaxEnv`` adds a family, and ``--env mytask:NAME``
then names its envs.
"""

from fastpbrl.core.imports import lazy_names

# name -> the module of this package that defines it.
_NAMES = {'JaxEnv': 'jax_envs', 'JaxEnvError': 'jax_envs',
          'register': 'jax_envs', 'spec_of': 'jax_envs'}

__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)
