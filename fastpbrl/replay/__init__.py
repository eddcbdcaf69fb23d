"""Replay buffers (per-member and shared layouts), the update-to-data rate
limiter and the prefetch thread. Host-side code: numpy and threads."""

from fastpbrl.replay.buffers import (DEFAULT_CAPACITY, LAYOUTS,
                                     PerMemberReplay, Replay, SharedReplay,
                                     bytes_per_transition, make_replay,
                                     transition_fields)
from fastpbrl.replay.prefetch import PrefetchError, Prefetcher, WaitStats
from fastpbrl.replay.rate_limiter import LimiterClosed, RateLimiter

__all__ = [
    'DEFAULT_CAPACITY', 'LAYOUTS', 'LimiterClosed', 'PerMemberReplay',
    'PrefetchError', 'Prefetcher', 'RateLimiter', 'Replay', 'SharedReplay',
    'WaitStats', 'bytes_per_transition', 'make_replay', 'transition_fields',
]
