"""Population rules acting between learner calls, as pure array functions on
the stacked training state and hyperparameters (population axis first).

* ``pbt``: Population Based Training's exploit-and-explore (Jaderberg et al.
  2017), plus host-side fitness tracking and lineage logging.
* ``cem``: the diagonal cross-entropy method of CEM-RL (Pourchot & Sigaud
  2019).
* ``dvd``: Diversity via Determinants (Parker-Holder et al. 2020): the
  diversity loss and its plug-in for the shared-critic learner, plus the
  host-side lambda schedule and bandit.
* ``hypertrick``: HyperTrick's asynchronous early stopping (Heinrich &
  Frosio), host-side, with a pure slot reset.

Host-side pieces (files, numpy bookkeeping) say so in their docstrings; all
others are jittable and never trigger a recompilation when values change.
The search spaces they sample from (``fastpbrl.search_space``) sit below
them and below the agents, which declare their default spaces.
"""

from fastpbrl.population import cem, dvd, hypertrick, pbt

__all__ = ['cem', 'dvd', 'hypertrick', 'pbt']
