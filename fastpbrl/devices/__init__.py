"""The population over devices and processes: the population axis sharded
over a mesh (``sharding``) and multi-process JAX (``distributed``; its
launcher is ``fastpbrl.launch``)."""
