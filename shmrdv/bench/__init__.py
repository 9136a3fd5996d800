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

from .command import add_arguments, run  # noqa: F401
from .common import *  # noqa: F401,F403
from .measure import *  # noqa: F401,F403
from .processes import *  # noqa: F401,F403
from .transports import *  # noqa: F401,F403
from .cleanup import *  # noqa: F401,F403
from .command import *  # noqa: F401,F403
