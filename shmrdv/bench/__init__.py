"""``shmrdv bench``: shmrdv side by side with what users pick instead.

This module is also the library behind ``benchmarks/`` (pytest-benchmark): the
transports, the child processes that drive them and the measurement loops live
here once, so the command line and the test suite measure the same thing.

Every transport moves the same float32 arrays between two spawned processes
and the consumer verifies what it got (the message number stamped into the
first and last element). A producer cycles through ``POOL`` source arrays, so
transports that keep a reference to what they were given (Queue, pyzmq with
``copy=False``, torch) never see an array rewritten before they are done with
it: each of them lets at most ``DEPTH`` messages be in flight.

Children are spawned, pinned, bounded (``SIGALRM`` after their lifetime, a
timeout on every wait, killed on failure) and every shared-memory segment a
benchmark creates is named ``/dev/shm/shmrdv-bench-<pid>-*`` and unlinked,
even after a crash of a child (``sweep_segments``), on SIGTERM and Ctrl-C
(``InterruptCleanup``), and after a run that was killed outright, by the next
run (``sweep_stale_segments``).
"""

from .cleanup import alive, descendants, InterruptCleanup, stop_processes, sweep_stale_segments  # noqa: F401
from .command import add_arguments, evaluate_targets, markdown, Results, run  # noqa: F401
from .machine import machine  # noqa: F401
from .common import arena_bytes, CLEANUP_GRACE_S, DATA_DTYPE, human_size, JOIN_TIMEOUT_S, KiB, MESSAGE_TIMEOUT_S, MiB, parse_size, ROUND_TRIP_SIZES, SIZES, STARTUP_TIMEOUT_S  # noqa: F401
from .measure import held_views_memory, keys_scaling, pending_keys_arena, process_scaling, round_trip_row, throughput_row, timed_round_trips, timed_stream  # noqa: F401
from .processes import allowed_cpus, ChildFailed, Children, pinned, Placement, placement, segment_prefix, sweep_segments, unique_name, untold_failure, wait_until_ready  # noqa: F401
from .transports import check, open_peer, Peer, PEERS, stamp, TRANSPORTS  # noqa: F401
