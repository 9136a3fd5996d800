"""How ``shmrdv bench`` fails: its options, or a measurement (the command
line turns each into its exit status)."""


class OptionsError(ValueError):
    """Options of ``shmrdv bench`` that cannot work together: a usage error (exit status 2)."""


class MeasurementFailed(Exception):
    """A measurement of ``shmrdv bench`` failed: a child died, a message did not come or came wrong.
    The message says which measurement and why, in one line (exit status 1)."""
