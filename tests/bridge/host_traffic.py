"""Traffic between simulated hosts (tests/bridge/hosts.py), run on one host as
``python tests/bridge/host_traffic.py CONFIG_JSON``; the tests read what it prints.

A *stream* is one TF-style key from this host to a peer: messages numbered
0, 1, ... under ``create_key(/job:h<src>/..., /job:h<dst>/..., "s<k>")``,
routed to the peer's bridge by ``Rendezvous(routes=...)``. Each message is
int64 words ``[src, k, seq, flags, crc32(body)]`` and a body whose size
cycles from 8 bytes to 1 MiB; the last message of a stream has LAST in its
flags. The receiver of a stream checks every message: it belongs to the
stream, its seq is the next one (a lower one is a duplicate, a higher one
means something was lost or reordered), its body's crc32 matches.

Lines on stdout, in order: ``ready``; ``sent`` once every stream has been
sent (or the rendezvous aborted); ``drained`` once every stream has been
received and nothing is left in flight here (no message pending, no block
held: every envelope acknowledged; "quiet" in the report says whether that
came before the drain timeout); then, once the test writes ``check`` to
stdin (every host drained, so nothing can still arrive), a try_recv on each
received stream must find nothing, and one JSON line reports it all.
"""
import json
import sys
import threading
import time
import zlib

import numpy as np

import shmrdv

LAST = 1
HEAD_WORDS = 5
# Body sizes in int64 words, cycled by seq: 8 B, 1 KiB, 64 KiB, 0 B; every
# 97th message 1 MiB.
BODY_WORDS = (1, 128, 8192, 0)
BIG_WORDS, BIG_EVERY = 131072, 97


def device(host: int) -> str:
    return f"/job:h{host}/replica:0/task:0/device:CPU:0"


def stream_key(src: int, dst: int, k: int) -> str:
    return shmrdv.create_key(device(src), 1, device(dst), f"s{k}", (0, 0))


def body_words(seq: int) -> int:
    return BIG_WORDS if seq % BIG_EVERY == BIG_EVERY - 1 else BODY_WORDS[seq % len(BODY_WORDS)]


def stream_bytes(count: int) -> int:
    """The payload bytes of a stream's first count messages."""
    return sum(8 * (HEAD_WORDS + body_words(seq)) for seq in range(count))


def message(src: int, k: int, seq: int, flags: int = 0) -> np.ndarray:
    n = body_words(seq)
    msg = np.empty(HEAD_WORDS + n, np.int64)
    msg[HEAD_WORDS:] = np.arange(n, dtype=np.int64) * (seq + 1) + (src << 40) + (k << 32)
    msg[:HEAD_WORDS] = (src, k, seq, flags, zlib.crc32(msg[HEAD_WORDS:]))
    return msg


class Traffic:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.me = cfg["me"]
        self.rdv = shmrdv.Rendezvous(cfg["name"], routes=cfg["routes"], token=cfg["token"])
        self.lock = threading.Lock()
        self.sent = {}  # "dst/k" -> messages sent, the LAST one included
        self.received = {}  # "src/k" -> messages received in order, the LAST one included
        self.complete = set()  # "src/k" whose LAST arrived
        self.anomalies = []  # every message that was not the next one of its stream, or damaged
        self.errors = []  # exceptions that ended a sender or receiver
        self.aborted = None  # the abort reason, if the rendezvous was aborted

    def note_error(self, where: str, exc: BaseException) -> None:
        with self.lock:
            if isinstance(exc, shmrdv.Aborted):
                self.aborted = exc.reason
            self.errors.append(f"{where}: {type(exc).__name__}: {exc}")

    def send_to(self, dst: int) -> None:
        keys, seconds, limit = self.cfg["keys"], self.cfg["seconds"], self.cfg["max_messages"]
        pause = self.cfg.get("pause", 0.0)
        end = time.monotonic() + seconds
        seq = 0
        try:
            while seq < limit - 1 and time.monotonic() < end:
                for k in range(keys):
                    self.rdv.send(stream_key(self.me, dst, k), message(self.me, k, seq), timeout=self.cfg["send_timeout"])
                    self.sent[f"{dst}/{k}"] = seq + 1
                seq += 1
                if pause:
                    time.sleep(pause)
            for k in range(keys):
                self.rdv.send(stream_key(self.me, dst, k), message(self.me, k, seq, LAST), timeout=self.cfg["send_timeout"])
                self.sent[f"{dst}/{k}"] = seq + 1
        except Exception as exc:
            self.note_error(f"send to h{dst}", exc)

    def check(self, src: int, k: int, expect: int, got: np.ndarray) -> bool:
        """Whether got is message `expect` of stream src/k, intact; notes what is wrong if not."""
        head = [int(x) for x in got[:HEAD_WORDS]]
        if got.dtype != np.int64 or got.ndim != 1 or got.size < HEAD_WORDS:
            what = f"dtype {got.dtype} shape {got.shape}"
        elif head[0] != src or head[1] != k:
            what = f"message of stream {head[0]}/{head[1]}"
        elif head[2] < expect:
            what = f"duplicate of seq {head[2]}"
        elif head[2] > expect:
            what = f"seq {head[2]}: {head[2] - expect} lost or reordered before it"
        elif got.size != HEAD_WORDS + body_words(expect) or zlib.crc32(got[HEAD_WORDS:]) != head[4]:
            what = "damaged body (size or crc32)"
        else:
            return True
        with self.lock:
            self.anomalies.append(f"stream {src}/{k}, expecting seq {expect}: {what}")
        return False

    def receive_from(self, src: int, k: int) -> None:
        key = stream_key(src, self.me, k)
        name = f"{src}/{k}"
        expect = 0
        try:
            while True:
                got = self.rdv.recv(key, timeout=self.cfg["recv_timeout"])
                if self.check(src, k, expect, got):
                    expect += 1
                    self.received[name] = expect
                    if got[3] & LAST:
                        self.complete.add(name)
                        return
                del got
        except Exception as exc:
            self.note_error(f"receive {name}", exc)

    def quiet(self) -> bool:
        """Nothing pending and no block held here: every envelope acknowledged."""
        stats = self.rdv.stats()
        return stats.pending_messages == 0 and stats.live_blocks == 0

    def run(self) -> None:
        cfg = self.cfg
        senders = [threading.Thread(target=self.send_to, args=(dst,)) for dst in cfg["send_to"]]
        receivers = [threading.Thread(target=self.receive_from, args=(src, k))
                     for src in cfg["recv_from"] for k in range(cfg["keys"])]
        print("ready", flush=True)
        for t in senders + receivers:
            t.start()
        for t in senders:
            t.join()
        print("sent", flush=True)
        for t in receivers:
            t.join()
        end = time.monotonic() + cfg["drain_timeout"]
        quiet = self.quiet()
        while self.aborted is None and not quiet and time.monotonic() < end:
            time.sleep(0.05)
            quiet = self.quiet()
        stats = self.rdv.stats()
        print("drained", flush=True)
        if sys.stdin.readline().strip() == "check":
            for src in cfg["recv_from"]:
                for k in range(cfg["keys"]):
                    try:
                        extra = self.rdv.try_recv(stream_key(src, self.me, k))
                    except shmrdv.RendezvousError as exc:
                        self.note_error(f"last look at {src}/{k}", exc)
                        continue
                    if extra is not None:
                        head = [int(x) for x in extra[:3]]
                        self.anomalies.append(f"stream {src}/{k}: message {head} after the last one")
        report = {
            "host": self.me, "sent": self.sent, "received": self.received, "complete": sorted(self.complete),
            "anomalies": self.anomalies, "errors": self.errors, "aborted": self.aborted or (stats.aborted and "aborted"),
            "quiet": quiet,
            "pending": stats.pending_messages, "live_blocks": stats.live_blocks,
        }
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    Traffic(json.loads(sys.argv[1])).run()
