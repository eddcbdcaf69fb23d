"""The data paths: what the run loop may ask of a source of data
(``protocol``), the one factory from a run's settings to a path
(``factory``), what every path shares (``common``), and the four paths in
two families: gymnasium envs stepped by actor processes (``actor_family``,
their base; ``actor_replay``, off-policy; ``actor_rollouts``, on-policy)
and JAX envs stepped inside the learner's compiled call
(``device_family``, their base; ``device_replay``, off-policy;
``device_rollouts``, on-policy). ``evaluation`` plays policies in the
learner process. A path module imports only ``common`` and its family's
module, never another path."""
