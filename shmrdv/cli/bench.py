"""``shmrdv bench``: shmrdv side by side with the transports people use instead
(the measurements are shmrdv.bench, which knows nothing of the command line:
its errors become the command line's here)."""
import argparse

from ..bench import command
from ..bench.errors import MeasurementFailed, OptionsError
from ._common import CommandError, UsageError

add_arguments = command.add_arguments


def run(args: argparse.Namespace) -> int:
    try:
        return command.run(args)
    except OptionsError as exc:
        raise UsageError(str(exc)) from exc
    except MeasurementFailed as exc:
        raise CommandError(str(exc)) from exc
