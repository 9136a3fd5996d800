"""``shmrdv bridge``: serve this host's rendezvous to other hosts and forward
routed sends to theirs (the service is shmrdv.bridge.service)."""
import argparse
import logging
import os
import signal
import ssl
import sys
import threading
from typing import Any, Dict, Optional, Tuple

from ..bridge import auth, protocol
from ..bridge.link import LinkSettings, tls_client_context
from ..bridge.server import HANDSHAKE_TIMEOUT_S, IDLE_TIMEOUT_S
from ..bridge.service import MAX_CONNECTIONS, MAX_PER_ADDRESS, Bridge, is_loopback, log
from ..errors import InvalidArgument
from ..segments import unlink_segment
from ._common import (CommandError, UsageError, add_dir_argument, arena_bytes, describe, open_showing_progress, others, positive_int,
                      rendezvous_name, seconds, seconds_or_zero)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", required=True, type=rendezvous_name, help="the rendezvous to serve (created if absent)")
    add_dir_argument(p)
    p.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to accept bridges and clients on (port 0: any)")
    p.add_argument("--size", type=arena_bytes, default=None,
                   help="arena size when creating the rendezvous: bytes, or with a unit (64MiB, 1G); default 64 MiB")
    p.add_argument("--token-file", help="file holding the shared token (surrounding whitespace ignored); required off loopback")
    p.add_argument("--tls-cert", help="PEM certificate: serve TLS")
    p.add_argument("--tls-key", help="PEM private key for --tls-cert")
    p.add_argument("--tls-ca", help="CA bundle to verify tls:// bridges this one forwards to (default: system)")
    p.add_argument("--route", action="append", default=[], metavar="PREFIX=URL",
                   help="a remote task and its bridge; told about aborts (sends carry their own routes)")
    p.add_argument("--deadline", type=seconds_or_zero, default=300.0,
                   help="seconds a message may wait for an unreachable bridge before the rendezvous is aborted "
                        "(0: forever; default %(default)g)")
    p.add_argument("--drain-timeout", type=seconds_or_zero, default=10.0,
                   help="seconds to wait for acknowledgements when stopping (default %(default)g)")
    p.add_argument("--handshake-timeout", type=seconds, default=HANDSHAKE_TIMEOUT_S,
                   help="seconds a connection has to authenticate, all of its handshake together (default %(default)g)")
    p.add_argument("--idle-timeout", type=seconds, default=IDLE_TIMEOUT_S,
                   help="seconds an authenticated peer may go silent in the middle of a message (or leave what "
                        "the bridge sends unread) before it is dropped and its half-received message freed "
                        "(default %(default)g)")
    p.add_argument("--max-connections", type=positive_int, default=MAX_CONNECTIONS,
                   help="connections served at once, and no more than the open-file limit leaves room for; one more "
                        "takes the place of the oldest not yet authenticated, or is closed (default %(default)s)")
    p.add_argument("--max-per-address", type=positive_int, default=MAX_PER_ADDRESS,
                   help="connections from one peer address served at once; more are closed at once "
                        "(default %(default)s)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="default %(default)s")


def _configuration(args: argparse.Namespace) -> Tuple[str, int, bytes, Dict[str, str], Optional[ssl.SSLContext]]:
    """(host, port, token, routes, TLS context) from the options; UsageError (status 2) if they cannot work."""
    try:
        host, port = protocol.split_host_port(args.listen, allow_any_port=True)
        token = auth.read_token_file(args.token_file) if args.token_file else b""
        routes = {}
        for item in args.route:
            prefix, sep, url = item.partition("=")
            if not sep:
                raise InvalidArgument(f"--route must be PREFIX=URL: {item!r}")
            protocol.parse_url(url)
            routes[prefix] = url
        tls = None
        if args.tls_cert or args.tls_key:
            if not (args.tls_cert and args.tls_key):
                raise InvalidArgument("--tls-cert and --tls-key go together")
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            try:
                tls.load_cert_chain(args.tls_cert, args.tls_key)
            except (OSError, ssl.SSLError) as exc:
                raise InvalidArgument(f"cannot load --tls-cert {args.tls_cert} / --tls-key {args.tls_key}: "
                                      f"{describe(exc)}") from exc
        if args.tls_ca:
            tls_client_context(args.tls_ca)  # a bad --tls-ca fails here, not in every link later
        if not token and not is_loopback(host):
            raise InvalidArgument(f"refusing to listen on {host}, which is not loopback, without --token-file")
    except ValueError as exc:
        raise UsageError(describe(exc)) from exc
    return host, port, token, routes, tls


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s shmrdv-bridge %(levelname)s %(message)s")
    host, port, token, routes, tls = _configuration(args)
    rdv = open_showing_progress(args.name, args.size, dir=args.dir)
    settings = LinkSettings(deadline=args.deadline or None)
    bridge = Bridge(rdv, (host, port), token, tls, args.tls_ca, routes, settings, args.drain_timeout,
                    args.handshake_timeout, args.max_connections, args.max_per_address, args.idle_timeout)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("got %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        bridge.start()
    except OSError as exc:
        # A segment made only to be served goes with the bridge that could not start (unless someone came).
        created = getattr(rdv, "_created", False) and not any(p.alive for p in others(rdv.processes(), os.getpid()))
        rdv.close()
        if created:
            unlink_segment(args.name, args.dir)
        raise CommandError(f"cannot listen on {host}:{port}: {describe(exc)}") from exc
    print(f"listening {bridge.address[0]}:{bridge.address[1]}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        bridge.stop()
    if bridge.leftover:
        # Exit without releasing the leased envelopes still held: the next
        # process to attach puts them back at the head of the outbox.
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)
    rdv.close()
    return 0
