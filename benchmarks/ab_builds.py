"""What the A/B scripts share (``ab_round_trip.py``, ``crowded_waiter.py``):
their command line and the alternating runs of two builds. Each script runs
itself with ``--run ARGS`` in each build's interpreter; a run prints its
figures on one line."""
import argparse
import subprocess
from typing import Dict, List


def parser(doc: str, pairs: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("old", help="the Python of the build before the change")
    p.add_argument("new", help="the Python of the build with it")
    p.add_argument("--pairs", type=int, default=pairs, help="runs of each build, alternating")
    return p


def alternate(args: argparse.Namespace, script: str, run_args: List[str]) -> Dict[str, List[List[float]]]:
    """``args.pairs`` runs of each build, old then new in turn: each run's printed figures."""
    runs: Dict[str, List[List[float]]] = {"old": [], "new": []}
    for _ in range(args.pairs):
        for build in ("old", "new"):
            out = subprocess.run([getattr(args, build), script, "--run", *run_args],
                                 check=True, capture_output=True, text=True, timeout=600).stdout
            runs[build].append([float(x) for x in out.split()])
    return runs
