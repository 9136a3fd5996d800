"""Exponential backoff, the one rule for every retry of the bridge: a link
reconnecting to its remote bridge, a message the remote turned away (ACK
RETRY), a ``connect()`` client retrying a request on a fresh connection.

The n-th wait is ``initial * 2**(n - 1)``, at most ``maximum``.
"""


def delay(attempt: int, initial: float, maximum: float) -> float:
    """The wait before retry number `attempt` (1, 2, ...)."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    return min(initial * 2.0 ** min(attempt - 1, 64), maximum)


class Backoff:
    """The waits of one sequence of retries; ``reset`` once a try succeeded."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum = initial, maximum
        self.attempts = 0

    def next(self) -> float:
        """How long to wait before the next try: initial, then doubling up to maximum."""
        self.attempts += 1
        return delay(self.attempts, self.initial, self.maximum)

    def reset(self) -> None:
        self.attempts = 0
