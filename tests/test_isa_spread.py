"""The suite's float64 tolerance holds whatever the CPU's vector width
(``tests/isa_spread.py``): the route pairs the tests compare, under the
narrowest instruction set XLA targets (SSE4.2) and the machine's widest."""

import pytest

from tests import isa_spread


@pytest.mark.slow
def test_float64_routes_stay_within_the_tolerance_on_every_isa(tmp_path):
  isas = ['SSE4_2', 'default']
  rows = isa_spread.compare(isa_spread.run_children(isas, str(tmp_path)))
  assert {(r['pair'], r['dtype'], r['isa']) for r in rows} == {
      (p, d, i) for p in isa_spread.PAIRS for d in isa_spread.DTYPES
      for i in isas}
  table = isa_spread.table(rows)
  for r in rows:
    if r['dtype'] == 'float64':
      # Within numerics.TRAJECTORY: between the routes under each
      # instruction set, and for one route between instruction sets.
      assert r['route']['max_ratio'] <= 1, table
      assert r.get('isa_vs_default', {'max_ratio': 0})['max_ratio'] <= 1, table
  # The cap takes effect: float32 rounds differently under SSE4.2 (else
  # this check would compare a program with itself).
  assert any(r['isa_vs_default']['max_abs'] > 0 for r in rows
             if r['dtype'] == 'float32' and r['isa'] == 'SSE4_2'), table
