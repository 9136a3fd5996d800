"""Byte counts for people: the one format the command line prints
(``human_bytes``) and the one it reads (``parse_bytes``)."""
import re

def human_bytes(n: float) -> str:
    """A byte count for people, in binary units (1 KiB = 1024 B): "64 B",
    "4 KiB", "1.5 MiB". A whole number of its unit has no decimals ("16 MiB"),
    anything else one ("1.0 KiB" is 1025 to 1075 bytes). The one byte format of
    the command line (ls, stat, demo, bench)."""
    value = float(n)
    for unit in _UNITS:
        if unit == "B":
            if abs(value) < 1024:
                return f"{value:.0f} B"
        else:
            shown = round(value, 1)
            if abs(shown) < 1024 or unit == _UNITS[-1]:
                return f"{value:.0f} {unit}" if value == int(value) else f"{shown:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")

# Units the command line takes, case-insensitive; binary all: K = KiB = 1024 B, M = MiB, G = GiB.
SIZE_UNITS = {"b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
UNITS_TEXT = "B, K, KiB, M, MiB, G, GiB (case-insensitive; K = KiB = 1024 B)"
_SIZE_RE = re.compile(r"([0-9]+)\s*([a-z]*)\Z")


def parse_bytes(text: str) -> int:
    """A byte count as the command line takes one: a whole number of bytes,
    or of one of the units (SIZE_UNITS): "64", "64B", "4k", "16MiB" (the
    reverse of human_bytes). ValueError saying what is accepted otherwise."""
    match = _SIZE_RE.match(text.strip().lower())
    if not match:
        raise ValueError(f"not a size: {text.strip()!r}: a whole number, optionally with one of the units "
                         f"{UNITS_TEXT}, e.g. 64B, 4KiB, 16MiB")
    if match.group(2) and match.group(2) not in SIZE_UNITS:
        unit = text.strip()[len(text.strip()) - len(match.group(2)):]
        raise ValueError(f"unknown unit {unit!r} in {text.strip()!r}: the units are {UNITS_TEXT}")
    return int(match.group(1)) * SIZE_UNITS.get(match.group(2), 1)
