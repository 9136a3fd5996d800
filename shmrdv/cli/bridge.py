"""``shmrdv bridge``: serve this host's rendezvous to other hosts and forward
routed sends to theirs (the service is shmrdv.bridge.service)."""
import argparse
import logging
import os
import signal
import ssl
import sys
import threading
from typing import Any

from ..bridge import auth, protocol
from ..bridge.link import LinkSettings
from ..bridge.service import Bridge, is_loopback, log
from ..errors import InvalidArgument
from ..rendezvous import Rendezvous


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", required=True, help="the rendezvous to serve (created if absent)")
    p.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to accept bridges and clients on (port 0: any)")
    p.add_argument("--size", type=int, default=None, help="arena bytes when creating the rendezvous")
    p.add_argument("--token-file", help="file holding the shared token (surrounding whitespace ignored); required off loopback")
    p.add_argument("--tls-cert", help="PEM certificate: serve TLS")
    p.add_argument("--tls-key", help="PEM private key for --tls-cert")
    p.add_argument("--tls-ca", help="CA bundle to verify tls:// bridges this one forwards to (default: system)")
    p.add_argument("--route", action="append", default=[], metavar="PREFIX=URL",
                   help="a remote task and its bridge; told about aborts (sends carry their own routes)")
    p.add_argument("--deadline", type=float, default=300.0, help="seconds a message may wait for an unreachable bridge before the rendezvous is aborted (0: forever)")
    p.add_argument("--drain-timeout", type=float, default=10.0, help="seconds to wait for acknowledgements when stopping")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s shmrdv-bridge %(levelname)s %(message)s")
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
            tls.load_cert_chain(args.tls_cert, args.tls_key)
        if not token and not is_loopback(host):
            raise InvalidArgument(f"refusing to listen on {host}, which is not loopback, without --token-file")
    except (ValueError, OSError, ssl.SSLError) as exc:
        log.error("%s", exc)
        return 2
    rdv = Rendezvous(args.name, size=args.size)
    settings = LinkSettings(deadline=args.deadline or None)
    bridge = Bridge(rdv, (host, port), token, tls, args.tls_ca, routes, settings, args.drain_timeout)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("got %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        bridge.start()
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host, port, exc)
        rdv.close()
        return 1
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
