"""The per-member evaluation returns every rule reads
(``fastpbrl.rules.common``), against lists written out by hand."""

import math

import numpy as np

from fastpbrl.core.types import EpisodeRecord
from fastpbrl.rules.common import evaluation_returns, evaluations


def _episodes():
  # member, return, evaluation, start version (true objective: -return)
  rows = [(2, 5.0, True, 3), (0, 1.0, True, 1), (0, 9.0, False, 4),
          (2, 7.0, True, 6), (0, 2.0, True, 5)]
  return tuple(EpisodeRecord(m, r, 10, e, 0, v, start_policy_version=v,
                             true_objective=-r) for m, r, e, v in rows)


def test_evaluation_returns_per_member_oldest_first():
  # The training episode (member 0, 9.0) never counts; member 1 has none.
  assert evaluation_returns(_episodes(), 3) == [[1.0, 2.0], [], [5.0, 7.0]]


def test_since_keeps_evaluations_started_after_each_members_mark():
  marked_at = np.array([1, 0, 5])
  # Member 0: started at 1 (not after 1) and 5; member 2: 3 and 6.
  assert evaluation_returns(_episodes(), 3, since=marked_at) == [
      [2.0], [], [7.0]]


def test_another_field_and_the_episode_order():
  assert evaluation_returns(_episodes(), 3, field='true_objective') == [
      [-1.0, -2.0], [], [-5.0, -7.0]]
  assert [r.member for r in evaluations(_episodes())] == [2, 0, 2, 0]
  assert all(math.isfinite(r.episode_return) for r in evaluations(()))
