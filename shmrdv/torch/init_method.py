"""``init_method="shmrdv://NAME"``: torch's rendezvous handler for the
scheme ``shmrdv``, registered when ``shmrdv.torch`` is imported. It yields
``(Store, rank, world_size)`` as ``env://`` does: rank and world size from
the URL's query (``?rank=R&world_size=W``; ``init_process_group`` puts its
own arguments there), else from ``RANK`` and ``WORLD_SIZE``.

The ranks of one job meet in the Store named NAME (``dir=`` in the query,
else ``SHMRDV_DIR``, else /dev/shm); the last of them to let its Store go
removes the segment. ``shmrdv://`` with no name, under torchrun, names the
Store after the run and its restart (``torchrun-RUN_ID-RESTART``), so a
restarted round never reads what the last one left."""
import os
import urllib.parse
from datetime import timedelta
from typing import Any, Dict, Iterator, Tuple

from .store import Store

SCHEME = "shmrdv"


def _param(query: Dict[str, str], name: str, env: str) -> int:
    value = query.get(name, os.environ.get(env))
    if value is None:
        raise ValueError(f"shmrdv:// rendezvous: {name} parameter missing (pass it, or set {env})")
    return int(value)


def store_name(url: urllib.parse.ParseResult) -> str:
    """The Store's name from the URL (netloc and path), or the torchrun run's when empty."""
    name = (url.netloc + url.path).strip("/")
    if name:
        return name
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        raise ValueError("shmrdv:// rendezvous: no name (shmrdv://NAME), and not under torchrun")
    return f"torchrun-{run_id}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def handler(url: str, timeout: timedelta = timedelta(seconds=300), **kwargs: Any) -> Iterator[Tuple[Store, int, int]]:
    """torch's rendezvous handler for ``shmrdv://NAME``: yields ``(store, rank, world_size)`` once."""
    parsed = urllib.parse.urlparse(url)
    query = dict(urllib.parse.parse_qsl(parsed.query))
    rank = _param(query, "rank", "RANK")
    world_size = _param(query, "world_size", "WORLD_SIZE")
    store = Store(store_name(parsed), world_size=world_size, timeout=timeout, dir=query.get("dir"))
    yield (store, rank, world_size)
    raise RuntimeError("shmrdv:// rendezvous handler is not meant to yield twice")
