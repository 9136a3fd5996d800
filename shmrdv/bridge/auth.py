"""Bridge authentication: HMAC-SHA256 challenge-response on a shared token.

Each side sends a fresh random nonce and proves it holds the token by a MAC
over both nonces; the token itself never crosses the wire, and a recorded
exchange cannot be replayed against a new nonce. The client's proof also
covers its origin id and first sequence number, so a man in the middle
cannot splice another origin's dedupe window onto it or make the bridge
skip messages."""
import hashlib
import hmac
import os
import struct
from typing import Optional, Union

from ..errors import InvalidArgument, InvalidType

Token = Union[str, bytes, None]


def normalize_token(token: Token) -> bytes:
    """The token's bytes: str is UTF-8; surrounding whitespace is ignored, as
    in a token file. None means no token (only for loopback bridges)."""
    if token is None:
        return b""
    if isinstance(token, str):
        token = token.encode("utf-8")
    if not isinstance(token, (bytes, bytearray)):
        raise InvalidType(f"token must be str or bytes, not {type(token).__name__}")
    token = bytes(token).strip()
    if not token:
        raise InvalidArgument("token is empty")
    return token


def read_token_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 16)
    except OSError as exc:
        raise InvalidArgument(f"cannot read token file {path}: {exc.strerror}") from exc
    if not data.strip():
        raise InvalidArgument(f"token file {path} is empty")
    return normalize_token(data)


def nonce() -> bytes:
    return os.urandom(32)


def client_proof(token: bytes, server_nonce: bytes, client_nonce: bytes, origin: int, first_seq: int) -> bytes:
    msg = b"shmrdv-client\0" + server_nonce + client_nonce + struct.pack("<QQ", origin, first_seq)
    return hmac.new(token, msg, hashlib.sha256).digest()


def server_proof(token: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(token, b"shmrdv-server\0" + client_nonce + server_nonce, hashlib.sha256).digest()


def matches(expected: bytes, got: Optional[bytes]) -> bool:
    return got is not None and hmac.compare_digest(expected, got)
