"""Routes: which TF-style keys leave this host, and for which bridge.

A route maps a device-name prefix (``/job:worker/replica:0/task:1``) to a
bridge URL (``tcp://hostB:7700`` or ``tls://...``). A key whose parsed
``dst_device`` is the prefix or lies under it (the next character is ``/``)
is remote; the longest matching prefix wins. Keys that do not parse as TF
keys, and keys under no route, stay local.
"""
import logging
import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..codec import as_sendable, dtype_code
from ..errors import InvalidArgument, InvalidType, MessageTooLarge, RendezvousError
from ..keys import parse_key
from ..tensors import as_tensor
from . import outbox
from .auth import Token, normalize_token
from .protocol import parse_url

_MAX_CACHED = 4096
log = logging.getLogger("shmrdv.bridge")


class Routes:
    """A route table plus the credentials a send to it needs; each key's
    decision is cached, so routing costs one dict lookup per send."""

    def __init__(self, routes: Mapping[str, str], token: Token, tls_ca: Optional[str]) -> None:
        if not isinstance(routes, Mapping):
            raise InvalidType(f"routes must be a mapping of device prefix to bridge URL, not {type(routes).__name__}")
        self._routes: Dict[str, str] = {}
        for prefix, url in routes.items():
            if not isinstance(prefix, str) or not prefix.startswith("/") or prefix.endswith("/") or ";" in prefix:
                raise InvalidArgument(f"route prefix must be a device name like '/job:worker/replica:0/task:1': {prefix!r}")
            try:
                parse_url(url)
            except (TypeError, ValueError) as exc:
                raise InvalidArgument(f"route {prefix!r}: {exc}") from None
            self._routes[prefix] = url
        self._token = normalize_token(token)
        if tls_ca is not None and not isinstance(tls_ca, str):
            raise InvalidType(f"tls_ca must be a path (str), not {type(tls_ca).__name__}")
        if tls_ca is not None:
            from .link import tls_client_context  # TLS only for a process that asks for it

            tls_client_context(tls_ca)  # now, not in the bridge that would read it for every send
        self._ca = (tls_ca or "").encode("utf-8")
        self._by_key: Dict[str, Optional[bytes]] = {}

    @property
    def table(self) -> Dict[str, str]:
        return dict(self._routes)

    @property
    def token(self) -> bytes:
        return self._token

    @property
    def tls_ca(self) -> Optional[str]:
        return self._ca.decode("utf-8") or None

    def url_for(self, key: str) -> Optional[bytes]:
        """The bridge URL (bytes) a key goes to, or None when it stays local."""
        try:
            return self._by_key[key]
        except (KeyError, TypeError):  # TypeError: not a str; send says so
            pass
        url = None
        try:
            dst = parse_key(key).dst_device
        except (TypeError, ValueError):
            dst = None
        if dst is not None:
            best = -1
            for prefix, target in self._routes.items():
                if len(prefix) > best and (dst == prefix or dst.startswith(prefix + "/")):
                    best, url = len(prefix), target.encode("ascii")
        if isinstance(key, str):
            if len(self._by_key) >= _MAX_CACHED:
                self._by_key.clear()
            self._by_key[key] = url
        return url

    def envelope_head(self, url: bytes, kb: bytes, code: bytes, shape: Tuple[int, ...], nbytes: int) -> Tuple[bytes, int]:
        return outbox.head(url, self._token, self._ca, kb, code, shape, nbytes)

    def _urls(self) -> List[str]:
        """Each bridge the routes go to, once, in order."""
        return sorted(set(self._routes.values()))

    def announce(self, rdv: Any) -> None:
        """Tell this host's bridge about every route (an empty envelope each),
        without waiting: with the arena full, the first send announces instead."""
        for url in self._urls():
            head, off = self.envelope_head(url.encode("ascii"), outbox.ANNOUNCE_KEY, b"|u1", (0,), 0)
            try:
                envelope = rdv.alloc(outbox.OUTBOX_KEY, (off,), np.uint8, timeout=0)
                with RemoteAllocation(envelope, head, off, np.dtype(np.uint8), (0,)):
                    pass
            except RendezvousError:
                pass

    def tell_abort(self, reason: str) -> None:
        """Tell every route's bridge of this rendezvous's abort directly: this
        host's bridge may not have read the announcements yet when the abort
        frees them, and then it would not know whom to tell."""
        try:
            from .link import tell_abort_all  # sockets and TLS only for a process that aborts
            from .protocol import abort

            tell_abort_all([(url, self._token, self.tls_ca) for url in self._urls()], abort(reason))
        except Exception as exc:  # e.g. no new thread at interpreter shutdown: the local abort stands
            log.warning("could not tell the routes' bridges about the abort: %s", exc)

    def alloc(self, rdv: Any, url: bytes, key: str, dtype: np.dtype, shape: Tuple[int, ...], timeout: Optional[float],
              tensor: bool = False) -> "RemoteAllocation":
        """``alloc`` of a routed key: an outbox envelope for this host's bridge
        (its buffer a torch tensor if tensor)."""
        nbytes = math.prod(shape) * dtype.itemsize
        head, off = self.envelope_head(url, key.encode("utf-8"), dtype_code(dtype), shape, nbytes)
        try:
            envelope = rdv.alloc(outbox.OUTBOX_KEY, (off + nbytes,), np.uint8, timeout=timeout)
        except MessageTooLarge as exc:
            raise MessageTooLarge(f"send {key!r}: {exc}") from None
        return RemoteAllocation(envelope, head, off, dtype, shape, tensor)

    def send(self, rdv: Any, url: bytes, key: str, array: Any, timeout: Optional[float]) -> None:
        """``send`` of a routed key: still one copy, into the envelope."""
        arr = as_sendable(array)
        with self.alloc(rdv, url, key, arr.dtype, arr.shape, timeout) as dst:
            np.copyto(dst, arr)


class RemoteAllocation:
    """``alloc`` for a routed key: the buffer is the payload of an outbox
    envelope, so the tensor is still written once, in place."""

    def __init__(self, envelope: Any, head: bytes, payload_off: int, dtype: np.dtype, shape: Tuple[int, ...],
                 tensor: bool = False) -> None:
        self._envelope = envelope
        self._head, self._off, self._dtype, self._shape = head, payload_off, dtype, shape
        self._tensor = tensor

    def __enter__(self) -> Any:
        buf = self._envelope.__enter__()
        buf[: len(self._head)] = np.frombuffer(self._head, np.uint8)
        arr = outbox.payload_array(buf, self._off, self._dtype, self._shape)
        return as_tensor(arr) if self._tensor else arr

    def __exit__(self, *exc: Any) -> None:
        self._envelope.__exit__(*exc)
