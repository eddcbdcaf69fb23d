"""Run logs: evaluation points, summary table and plot from member CSVs."""

import os
import resource

from fastpbrl.core.types import EpisodeRecord
from fastpbrl.logs.logging import (RuleLog, RunLogger, evaluation_points,
                                   plot_returns, read_member_csvs,
                                   read_rule_csv, summary_table)


def _row(steps, ret, evaluation, wall=0.0):
  return dict(env_steps=steps, episode_return=ret, evaluation=evaluation,
              wall_time=wall, update_steps=steps, member=0, episode_length=10)


def test_evaluation_points_average_each_evaluation_and_drop_a_cut_one():
  rows = [_row(5, -900.0, 'False'),
          _row(10, -10.0, 'True', 1.0), _row(20, -30.0, 'True', 2.0),
          _row(25, -800.0, 'False'),
          _row(110, -1.0, 'True', 3.0), _row(120, -2.0, 'True', 4.0),
          _row(210, -5.0, 'True', 5.0)]  # the run ended mid-evaluation
  assert evaluation_points(rows, 2) == [(20.0, 2.0, -20.0), (120.0, 4.0, -1.5)]
  assert [p[2] for p in evaluation_points(rows, 1)] == [-10, -30, -1, -2, -5]


def test_logger_files_summary_and_plot(tmp_path):
  run_dir = str(tmp_path)
  logger = RunLogger(run_dir, 2, total_env_steps=100, progress=False)
  episodes = [(0, -50.0, False), (0, -40.0, True), (0, -20.0, True),
              (1, -70.0, True), (1, -10.0, True)]
  from fastpbrl.core.types import EpisodeRecord
  logger.episodes([EpisodeRecord(m, r, 10, e, 10, 1) for m, r, e in episodes],
                  env_steps=10, update_steps=10)
  logger.close()
  members = read_member_csvs(run_dir)
  assert [len(m) for m in members] == [3, 2]
  table = summary_table(run_dir, [{'lr': 1e-3}, {'lr': 3e-4}], eval_episodes=2)
  lines = table.splitlines()
  # member 0: one evaluation, mean(-40, -20) = -30; member 1: mean -40.
  assert lines[1].split()[:4] == ['0', '3', '-30.0', '-30.0']
  assert lines[2].split()[:4] == ['1', '2', '-40.0', '-40.0']
  assert '"lr": 0.0003' in lines[2]
  path = plot_returns(run_dir, eval_episodes=2)
  assert os.path.getsize(path) > 1000


def test_summary_gives_the_true_objective_where_the_env_reports_one(
    tmp_path):
  logger = RunLogger(str(tmp_path), 2, total_env_steps=100, progress=False,
                     eval_episodes=2, track='none')
  # member, shaped return, evaluation, true objective (NaN: none reported)
  episodes = [(0, 50.0, False, -90.0), (0, 40.0, True, -80.0),
              (0, 20.0, True, -60.0), (1, 70.0, True, -100.0),
              (1, 10.0, True, -120.0)]
  logger.episodes([EpisodeRecord(m, r, 10, e, 10, 1, 1, o)
                   for m, r, e, o in episodes], env_steps=10,
                  update_steps=10)
  logger.close()
  lines = summary_table(str(tmp_path), eval_episodes=2).splitlines()
  assert lines[0].split() == ['member', 'episodes', 'eval_last', 'eval_best',
                              'objective_last']
  # Member 0: returns (40 + 20) / 2 = 30, objective (-80 - 60) / 2 = -70;
  # member 1: 40 and -110.
  assert lines[1].split() == ['0', '3', '30.0', '30.0', '-70.0']
  assert lines[2].split() == ['1', '2', '40.0', '40.0', '-110.0']
  # An env without an objective: no such column.
  other = tmp_path / 'other'
  logger = RunLogger(str(other), 1, total_env_steps=100, progress=False,
                     track='none')
  logger.episodes([EpisodeRecord(0, 1.0, 10, True, 10, 1)], env_steps=10,
                  update_steps=10)
  logger.close()
  assert summary_table(str(other)).splitlines()[0].split() == [
      'member', 'episodes', 'eval_last', 'eval_best']


def test_logger_writes_whole_evaluations_only(tmp_path):
  from fastpbrl.core.types import EpisodeRecord
  run_dir = str(tmp_path)
  logger = RunLogger(run_dir, 1, total_env_steps=100, progress=False,
                     eval_episodes=2)
  def ev(ret, version):
    return EpisodeRecord(0, ret, 10, True, 10, version, version)
  # An evaluation of version 3 cut short (its actor restarted), a whole one
  # of version 5, a train episode in between, then one under way at the end.
  logger.episodes([ev(-100.0, 3), ev(-10.0, 5),
                   EpisodeRecord(0, -70.0, 10, False, 10, 5, 5), ev(-20.0, 5),
                   ev(-1.0, 6)], env_steps=10, update_steps=10)
  logger.drop_partial_evaluations()
  logger.episodes([ev(-4.0, -1), ev(-6.0, -1)], env_steps=20, update_steps=20)
  logger.close()
  rows = read_member_csvs(run_dir)[0]
  assert [(r['evaluation'], float(r['episode_return'])) for r in rows] == [
      ('False', -70.0), ('True', -10.0), ('True', -20.0), ('True', -4.0),
      ('True', -6.0)]
  assert [p[2] for p in evaluation_points(rows, 2)] == [-15.0, -5.0]
  assert logger.best_return == -5.0


def test_rule_log_keeps_scalars_that_appear_later_and_survives_a_resume(
    tmp_path):
  log = RuleLog(str(tmp_path))
  log.write(100, 10, {'lam': 0.5, 'distance': None})  # not measured yet
  log.write(200, 20, {'lam': 0.0, 'distance': 1.25})
  log.close()
  log = RuleLog(str(tmp_path))  # a resumed run appends to the same file
  log.write(300, 30, {'lam': 0.5, 'distance': 0.75})
  log.write(400, 40, {})  # a rule without scalars writes nothing
  log.close()
  assert read_rule_csv(str(tmp_path)) == {
      'lam': [(100, 0.5), (200, 0.0), (300, 0.5)],
      'distance': [(200, 1.25), (300, 0.75)]}
  with open(tmp_path / 'rule.csv') as f:
    assert f.read().count('env_steps') == 1  # one header
  assert read_rule_csv(str(tmp_path / 'nowhere')) == {}


def test_progress_bar_reaches_its_total_at_the_end(tmp_path):
  # 2 members, 100 env steps each: the last learner call overshoots to 104
  # per member, and the bar stops at its total.
  logger = RunLogger(str(tmp_path), 2, total_env_steps=200, progress=True,
                     track='none')
  for per_member in (8, 16, 96):
    logger.progress(2 * per_member)
  assert logger._bar.n == 192
  logger.finish_progress(2 * 104)
  assert logger._bar.n == logger._bar.total == 200
  logger.close()


def test_logger_holds_no_file_per_member_open(tmp_path):
  """A population larger than the open-file limit logs every member: a
  member's CSV is opened only to append and closed again."""
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  n = 300
  resource.setrlimit(resource.RLIMIT_NOFILE, (min(128, hard), hard))
  try:
    logger = RunLogger(str(tmp_path), n, total_env_steps=100, progress=False,
                       track='none')
    logger.episodes([EpisodeRecord(m, -1.0 * m, 10, False, 10, 1)
                     for m in range(n)], env_steps=10, update_steps=10)
    logger.close()
  finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
  members = read_member_csvs(str(tmp_path))
  assert len(members) == n
  assert [float(m[0]['episode_return']) for m in members] == [
      -1.0 * m for m in range(n)]
