"""Running torch ranks in the tests: processes forked from a forkserver
that has imported torch once (importing torch takes seconds; forking it
does not). Each child reports through a queue, every join is bounded, and
each test checks that it left no process and no /dev/shm entry of its
own behind (``nothing_left_behind`` in conftest.py, for every test here).
"""
import os
import queue as queue_module
import time
import traceback
import warnings


JOIN_S = 60.0


def _child(results, target, rank, world, env, args):
    os.environ.update(env)
    warnings.simplefilter("ignore", FutureWarning)  # torch 2.13 renames some collectives
    try:
        value = target(rank, world, *args)
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        raise
    results.put((rank, "ok", value))


def run_ranks(ctx, world, target, *args, env=None, exits=None, timeout=JOIN_S):
    """Run target(rank, world, *args) in world processes; return {rank: value}.
    env(rank) gives a rank's extra environment; exits maps ranks to the exit
    code they must end with (default 0), and those with a non-zero one report nothing."""
    exits = exits or {}
    results = ctx.Queue()
    processes = [ctx.Process(target=_child, args=(results, target, r, world, env(r) if env else {}, args),
                             daemon=True) for r in range(world)]
    for p in processes:
        p.start()
    values, errors = {}, []
    deadline = time.monotonic() + timeout
    try:
        expected = sum(1 for r in range(world) if exits.get(r, 0) == 0)
        while len(values) + len(errors) < expected:
            try:
                rank, status, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue_module.Empty:
                break
            if status == "ok":
                values[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
        for p in processes:
            p.join(max(0.1, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(processes) if p.is_alive()]
    finally:
        for p in processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    assert not errors, "\n".join(errors)
    assert not hung, f"ranks {hung} still running after {timeout} s"
    codes = {r: p.exitcode for r, p in enumerate(processes)}
    assert codes == {r: exits.get(r, 0) for r in range(world)}, codes
    assert sorted(values) == [r for r in range(world) if exits.get(r, 0) == 0]
    return values
