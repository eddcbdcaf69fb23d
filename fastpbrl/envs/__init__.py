"""Environments: gymnasium ids made ready (``gym``), environments written in
JAX and their families (``jax_envs``), acting in JAX envs on the device
(``collect``), environment parameters searched beside hyperparameters
(``params``) and the shaped example task (``shaping``)."""
