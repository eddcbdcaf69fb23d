"""Using what a run trained: one member's policy (``policy``) and a run
folder's results as pandas tables (``run_data``)."""
