"""Actor processes stepping environments on CPU, the shared-memory param
store and the transition channels. Host-side code: processes, threads and
shared memory."""

from fastpbrl.actors.actor import Actor, ActorSpec, member_seeds, run_actor
from fastpbrl.actors.channel import Channel, chunk_layout
from fastpbrl.actors.param_store import ParamStore, ParamStoreHandle
from fastpbrl.actors.pool import (ActorDiedError, ActorFailure, ActorPool,
                                  ActorStatus, default_num_processes,
                                  split_members)

__all__ = [
    'Actor', 'ActorDiedError', 'ActorFailure', 'ActorPool', 'ActorSpec',
    'ActorStatus', 'Channel', 'ParamStore',
    'ParamStoreHandle', 'chunk_layout', 'default_num_processes',
    'member_seeds', 'run_actor', 'split_members',
]
