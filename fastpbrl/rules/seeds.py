"""Many seeds: N independent members, no population rule (host-side).

The baseline every rule is measured against; there is no pure half, so the
driver is all of it.
"""

from __future__ import annotations

from fastpbrl.run import Driver


class SeedsDriver(Driver):
  """N independent members at the agent's published defaults, each with its
  own initial parameters, env and exploration streams and replay: N seeds
  of one agent trained at once, and the baseline every rule is measured
  against."""

  name = 'seeds'
