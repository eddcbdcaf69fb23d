"""The end-of-run pictures draw exactly the records they are made from."""

import json
import os

import numpy as np
import pytest

from fastpbrl.logs.logging import HParamsLog
from fastpbrl.run import plots
from tests.rules.pbt.reference import write_lineage


def _lineage(n, copies):
  """Init events for ``n`` members at 0, then exploits ``(step, env_steps,
  member, parent)``."""
  events = [{'event': 'init', 'step': 0, 'env_steps': 100, 'member': i,
             'hparams': {'lr': 1e-3 * (i + 1)}} for i in range(n)]
  for step, env_steps, member, parent in copies:
    events.append({'event': 'exploit', 'step': step, 'env_steps': env_steps,
                   'member': member, 'parent': parent,
                   'old_hparams': {}, 'new_hparams': {'lr': 1.0}})
  return events


def test_lineage_lines_follow_the_copies():
  # 4 members. At step 50 (env 600): 0 copies 3 and 1 copies 0 -- copies
  # read the population as it was before the step, so 1 gets member 0's
  # ORIGINAL weights, not 3's. At step 90 (env 1000): 2 copies 0, which
  # now carries 3's weights.
  events = _lineage(4, [(50, 600, 0, 3), (50, 600, 1, 0), (90, 1000, 2, 0)])
  data = plots.lineage_lines(events, end=1200)
  assert data.x == 'env_steps' and data.members == 4
  assert data.copies == [plots.Copy(600, 3, 0), plots.Copy(600, 0, 1),
                         plots.Copy(1000, 0, 2)]
  assert data.segments == [
      plots.Segment(0, 100, 600, 0), plots.Segment(0, 600, 1200, 3),
      plots.Segment(1, 100, 600, 1), plots.Segment(1, 600, 1200, 0),
      plots.Segment(2, 100, 1000, 2), plots.Segment(2, 1000, 1200, 3),
      plots.Segment(3, 100, 1200, 3)]
  # Without env_steps on every event, the axis is update steps.
  for e in events:
    del e['env_steps']
  assert plots.lineage_lines(events).x == 'step'


def _hparam_rows(n, calls, seed=0):
  rng = np.random.default_rng(seed)
  rows = []
  for c in range(calls):
    for m in range(n):
      rows.append({'env_steps': 100.0 * (c + 1), 'update_steps': 10.0 * c,
                   'member': m, 'lr': float(rng.uniform(1e-5, 1e-2)),
                   'discount': float(rng.uniform(0.9, 0.999))})
  return rows


def test_hparam_lines_equal_the_csv_records(tmp_path):
  n, calls = 3, 5
  rows = _hparam_rows(n, calls)
  log = HParamsLog(str(tmp_path))
  for c in range(calls):
    mine = [r for r in rows if r['env_steps'] == 100.0 * (c + 1)]
    log.write(100 * (c + 1), 10 * c,
              [{'lr': r['lr'], 'discount': r['discount']} for r in mine])
  log.close()
  read = plots.read_hparams_csv(str(tmp_path))
  lines = plots.hparam_lines(read)
  assert set(lines) == {'lr', 'discount'}
  for name in ('lr', 'discount'):
    for m in range(n):
      xs, ys = lines[name][m]
      mine = [r for r in rows if r['member'] == m]
      assert xs == [r['env_steps'] for r in mine]
      # Exact: the csv module writes a float's repr, which reads back exactly.
      assert ys == [r[name] for r in mine]


@pytest.mark.parametrize('n', [4, 80])
def test_plot_run_writes_both_pictures(tmp_path, n):
  rng = np.random.default_rng(n)
  copies = [(10 * k, 100 * k, int(rng.integers(n)), int(rng.integers(n)))
            for k in range(1, 30)]
  events = [e for e in _lineage(n, copies)
            if e['event'] != 'exploit' or e['member'] != e['parent']]
  write_lineage(tmp_path / 'lineage.jsonl', events)
  with open(tmp_path / 'config.json', 'w') as f:  # names the rule: PBT
    json.dump({'rule': 'pbt'}, f)
  log = HParamsLog(str(tmp_path))
  for c in range(6):
    log.write(500 * c, 50 * c, [{'lr': float(rng.uniform(1e-5, 1e-3)),
                                 'tau': 0.005} for _ in range(n)])
  log.close()
  written = plots.plot_run(str(tmp_path))
  assert [os.path.basename(p) for p in written] == ['lineage.png',
                                                    'hparams.png']
  for path in written:
    assert os.path.getsize(path) > 5000
  assert not [f for f in os.listdir(tmp_path) if f.startswith('.tmp-')]


def test_plot_run_without_lineage_draws_only_hparams(tmp_path):
  log = HParamsLog(str(tmp_path))
  log.write(0, 0, [{'diversity_weight': 0.5}, {'diversity_weight': 0.5}])
  log.close()
  assert [os.path.basename(p) for p in plots.plot_run(str(tmp_path))] == [
      'hparams.png']


def _panel_rows():
  """Two members over three calls: lr differs (and is log-uniform), tau
  and discount never change (discount with float32 round-off), noise
  changes once at member 1's exploit (env steps 200)."""
  rows = []
  for env_steps in (0, 100, 200):
    for m in range(2):
      rows.append({'env_steps': float(env_steps), 'update_steps': 0.0,
                   'member': m, 'policy_lr': 1e-4 * 10 ** m,
                   'tau': 0.005, 'discount': 0.99 * (1 + 1e-8 * m),
                   'noise': 0.5 if (m, env_steps) == (1, 200) else 0.1})
  return rows


def test_hparams_figure_skips_fixed_fields_and_logs_log_uniform_ones():
  data = plots.hparam_panels(_panel_rows(), log_fields={'policy_lr', 'tau'},
                             exploits=[plots.Copy(200.0, 0, 1),
                                       plots.Copy(50.0, 1, 0)])
  assert [p.name for p in data.panels] == ['policy_lr', 'noise']
  assert set(data.fixed) == {'tau', 'discount'}
  fig = plots.hparams_figure(data, members=2)
  try:
    drawn = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert set(drawn) == {'policy_lr', 'noise'}
    assert drawn['policy_lr'].get_yscale() == 'log'
    assert drawn['noise'].get_yscale() == 'linear'  # Uniform: not in the set
    # One marker per exploit: member 1 at env steps 200, at the value it
    # took there; member 0 at 50, at the value of its row at 0.
    marks = drawn['noise'].collections[0].get_offsets().tolist()
    assert marks == [[200.0, 0.5], [50.0, 0.1]]
    assert 'tau=0.005' in fig._suptitle.get_text()
  finally:
    plots._pyplot().close(fig)


def test_plot_run_reads_the_log_uniform_fields_and_exploits_of_the_folder(
    tmp_path, monkeypatch):
  import json
  rows = _panel_rows()
  log = HParamsLog(str(tmp_path))
  for env_steps in (0, 100, 200):
    log.write(env_steps, 0, [{k: v for k, v in r.items()
                              if k not in ('env_steps', 'update_steps',
                                           'member')}
                             for r in rows if r['env_steps'] == env_steps])
  log.close()
  write_lineage(tmp_path / 'lineage.jsonl', _lineage(2, [(20, 200, 1, 0)]))
  # No --search-space: the agent's default space (TD3: log-uniform lrs).
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump({'rule': 'pbt', 'agent': 'td3', 'search_space': None}, f)
  assert plots.saved_log_fields(str(tmp_path)) == {'policy_lr', 'critic_lr'}
  drawn = {}
  real = plots.hparams_figure

  def keep(data, members, title=''):
    drawn['data'] = data
    return real(data, members, title)

  monkeypatch.setattr(plots, 'hparams_figure', keep)
  plots.plot_run(str(tmp_path))
  panels = {p.name: p for p in drawn['data'].panels}
  assert set(panels) == {'policy_lr', 'noise'}
  assert panels['policy_lr'].log and not panels['noise'].log
  assert panels['noise'].exploits == [(1, 200.0, 0.5)]
  # A run's own --search-space (inline JSON) wins over the agent's.
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump({'agent': 'td3', 'search_space': json.dumps(
        {'noise': {'kind': 'loguniform', 'low': 0.01, 'high': 1.0}})}, f)
  assert plots.saved_log_fields(str(tmp_path)) == {'noise'}
  os.remove(tmp_path / 'config.json')
  assert plots.saved_log_fields(str(tmp_path)) is None


def test_plot_run_draws_what_the_rule_declares(tmp_path):
  from fastpbrl.rules.base import RuleOutputs  # noqa: PLC0415
  write_lineage(tmp_path / 'lineage.jsonl', _lineage(2, [(20, 200, 1, 0)]))
  # A rule that declares no lineage: the file is not its, nothing drawn.
  assert plots.plot_run(str(tmp_path), outputs=RuleOutputs()) == []
  own = str(tmp_path / 'own.png')
  assert plots.plot_run(str(tmp_path), outputs=RuleOutputs(
      pictures=(lambda run_dir: own, lambda run_dir: None))) == [own]
