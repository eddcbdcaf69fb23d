"""The data paths: what the run loop may ask of a source of data
(``protocol``), the one factory from a run's settings to a path
(``factory``), and the four paths: gymnasium envs stepped by actor
processes (``actor_replay``, ``actor_rollouts``) and JAX envs stepped inside
the learner's compiled call (``device_replay``, ``device_rollouts``)."""
