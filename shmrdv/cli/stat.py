"""``shmrdv stat NAME``: one rendezvous in detail: arena use (live bytes and
blocks, free bytes, the largest free block: the largest message block that
fits now), keys with
their pending messages and waiters, and what each attached process holds."""
import argparse
import os
import time

from ..units import human_bytes
from ._common import add_dir_argument, attach, count, others, pages_text, rendezvous_name, shown_key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=rendezvous_name, help="the rendezvous name (a named one's segment is DIR/shmrdv-NAME)")
    add_dir_argument(parser)
    parser.add_argument("--keys", type=count, default=50, help="show at most this many keys (default 50)")


def run(args: argparse.Namespace) -> int:
    with attach(args.name, args.dir) as rdv:
        st, keys, procs, dead = rdv.stats(), rdv.keys(), others(rdv.processes(), os.getpid()), rdv.reclaimed_pids()
    print(f"rendezvous {args.name}{'  (ABORTED)' if st.aborted else ''}")
    print(f"  arena     {human_bytes(st.capacity)}: {human_bytes(st.bytes_used)} live in {st.live_blocks} blocks, "
          f"{human_bytes(st.bytes_free)} free, largest free block {human_bytes(st.largest_free)}")
    print(f"  messages  {st.pending_messages} pending on {st.keys} keys (index holds {st.max_keys}); {st.waiters} waiting receivers")
    print(f"  pages     {pages_text(st)}")
    if keys:
        print(f"  keys ({min(len(keys), args.keys)} of {len(keys)}):")
        for k in keys[: args.keys]:
            print(f"    {k.pending:>6} pending {k.waiters:>3} waiting  {shown_key(k.name) if k.name is not None else '(waiters only)'}")
    print(f"  processes ({len(procs)}):")
    for pid in dead:
        print(f"    pid {pid:<8} dead: reclaimed its views, blocks, waits and locks just now")
    for p in procs:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.attached_at))
        state = "alive" if p.alive else "dead" + (", being reclaimed" if p.reclaiming else "")
        print(f"    pid {p.pid:<8} {state:<6} since {since}  views {p.views} ({human_bytes(p.view_bytes)}), "
              f"writing {p.writing}, waiting {p.waits}")
    return 0
