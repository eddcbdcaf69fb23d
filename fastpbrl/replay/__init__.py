"""Replay buffers (per-member and shared layouts), the update-to-data rate
limiter and the prefetch thread. Host-side code: numpy and threads; the
device-resident replay (``device``) adds pure JAX rings sampled inside the
learner's compiled call."""

from fastpbrl.replay.buffers import (DEFAULT_CAPACITY, LAYOUTS, PerMemberReplay,
                                     Replay, SharedReplay, bytes_per_transition,
                                     make_replay, transition_fields)
from fastpbrl.replay.device import (DeviceReplay, DeviceReplayState,
                                    choose_replay_location)
from fastpbrl.replay.prefetch import PrefetchError, Prefetcher, WaitStats
from fastpbrl.replay.rate_limiter import LimiterClosed, RateLimiter

__all__ = [
    'DEFAULT_CAPACITY', 'DeviceReplay', 'DeviceReplayState', 'LAYOUTS',
    'LimiterClosed', 'PerMemberReplay', 'PrefetchError', 'Prefetcher', 'RateLimiter', 'Replay', 'SharedReplay',
    'WaitStats', 'bytes_per_transition', 'choose_replay_location',
    'make_replay', 'transition_fields',
]
