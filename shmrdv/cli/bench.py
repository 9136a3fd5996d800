"""``shmrdv bench``: shmrdv side by side with the transports people use instead
(the measurements are shmrdv.bench)."""
from ..bench.command import add_arguments, run  # noqa: F401 (the command's interface)
