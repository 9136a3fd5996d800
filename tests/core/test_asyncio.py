"""asyncio: recv_async futures are awaitable; arecv, arecv_any, asend; a
cancelled task leaves the line or puts its message back at the head of its
key; works under uvloop too when it is installed."""
import asyncio
import threading

import numpy as np
import pytest

import shmrdv


pytestmark = pytest.mark.timeout(60)

try:
    import uvloop
except ImportError:  # an optional peer
    uvloop = None

LOOPS = ["asyncio"] + (["uvloop"] if uvloop is not None else [])


def run(loop_kind, coro):
    if loop_kind == "uvloop":
        return uvloop.run(coro)
    return asyncio.run(coro)


def one(v):
    return np.array([v], dtype=np.int64)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_await_recv_async_arecv_and_arecv_any(rdv, loop_kind):
    async def main():
        task = asyncio.create_task(rdv.arecv("a", timeout=10))
        await asyncio.sleep(0.01)
        rdv.send("a", one(1))
        assert int((await task)[0]) == 1
        rdv.send("b", one(2))
        assert int((await rdv.recv_async("b"))[0]) == 2
        threading.Timer(0.05, lambda: rdv.send("y", one(3))).start()
        key, view = await rdv.arecv_any(["x", "y"], timeout=10)
        assert (key, int(view[0])) == ("y", 3)
        with pytest.raises(shmrdv.RendezvousTimeout):
            await rdv.arecv("never", timeout=0.05)
        await rdv.asend("c", one(4))
        assert int(rdv.recv("c", timeout=5)[0]) == 4

    run(loop_kind, main())
    assert rdv.stats().waiters == 0 and rdv.stats().pending_messages == 0


@pytest.mark.parametrize("bad", ["5", -1, float("nan"), True], ids=["str", "negative", "nan", "bool"])
def test_a_bad_timeout_puts_no_receiver_in_line(rdv, bad):
    """The timeout is checked before the receive starts: nothing is left in
    line to take the next message."""
    for call in (lambda: rdv.arecv("grads", timeout=bad), lambda: rdv.arecv_any(["grads", "other"], timeout=bad)):
        with pytest.raises((shmrdv.InvalidArgument, shmrdv.InvalidType), match="timeout"):
            asyncio.run(call())
    assert rdv.stats().waiters == 0
    rdv.send("grads", one(7))
    assert int(rdv.recv("grads", timeout=5)[0]) == 7


@pytest.mark.parametrize("timeout", [float("inf"), 1e300, 10**30], ids=["inf", "1e300", "10**30"])
def test_a_timeout_too_large_to_end_waits_forever(rdv, timeout):
    async def main():
        for call in (lambda: rdv.arecv("x", timeout=timeout), lambda: rdv.arecv_any(["x", "y"], timeout=timeout)):
            task = asyncio.create_task(call())
            await asyncio.sleep(0.05)
            assert not task.done()  # not timed out at once
            rdv.send("x", one(1))
            got = await task
            assert int((got[1] if isinstance(got, tuple) else got)[0]) == 1

    run("asyncio", main())
    assert rdv.stats().waiters == 0


def test_a_timeout_without_asyncio_timeout_leaves_the_line(rdv, monkeypatch):
    """Python 3.9 and 3.10 have no asyncio.timeout: arecv's timeout then
    comes from asyncio.wait_for, and still leaves the line."""
    monkeypatch.delattr(asyncio, "timeout", raising=False)

    async def main():
        for timeout in (0.05, 0):  # 0: wait_for cancels its task before it ever runs
            with pytest.raises(shmrdv.RendezvousTimeout, match=rf"arecv 'late': timed out after {timeout:g} s"):
                await rdv.arecv("late", timeout=timeout)
            assert rdv.stats().waiters == 0
        rdv.send("queued", one(4))
        try:  # a message there already: taken, or (timed out at once) left where it was
            assert int((await rdv.arecv("queued", timeout=0))[0]) == 4
        except shmrdv.RendezvousTimeout:
            assert int(rdv.recv("queued", timeout=5)[0]) == 4
        rdv.send("soon", one(5))
        assert int((await rdv.arecv("soon", timeout=5))[0]) == 5

    asyncio.run(main())
    rdv.send("late", one(6))
    assert rdv.stats().pending_messages == 1  # nobody took it


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_cancelled_task_leaves_the_line(rdv, loop_kind):
    async def main():
        task = asyncio.create_task(rdv.arecv("w"))
        await asyncio.sleep(0.02)
        assert rdv.stats().waiters == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(loop_kind, main())
    assert rdv.stats().waiters == 0
    rdv.send("w", one(1))
    assert rdv.stats().pending_messages == 1  # nobody took it


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_task_cancelled_after_the_hand_over_puts_the_message_back_first(rdv, loop_kind):
    async def main():
        loop = asyncio.get_running_loop()
        fut = rdv.recv_async("h")
        tasks = []
        # Registered before the task awaits fut: once fut has its message, the
        # task is cancelled before it can resume with it.
        fut.add_done_callback(lambda _: loop.call_soon_threadsafe(tasks[0].cancel))
        tasks.append(asyncio.create_task(_await(fut)))
        await asyncio.sleep(0.01)  # the task awaits fut now
        threading.Thread(target=lambda: (rdv.send("h", one(1)), rdv.send("h", one(2)))).start()
        with pytest.raises(asyncio.CancelledError):
            await tasks[0]

    run(loop_kind, main())
    assert [int(rdv.recv("h", timeout=5)[0]) for _ in range(2)] == [1, 2]


async def _await(fut):
    return await fut


@pytest.mark.parametrize("timeout", [10, None, float("inf"), 1e300], ids=["10s", "None", "inf", "1e300"])
def test_asend_waits_for_space_without_blocking_the_loop(rdv_name, timeout):
    """A timeout too large to end waits as None does (forever)."""
    with shmrdv.Rendezvous(rdv_name, size=64 * 1024, create=True) as rdv:
        try:
            big = np.zeros(40_000, np.uint8)
            rdv.send("full", big)

            async def main():
                ticks = 0

                async def tick():
                    nonlocal ticks
                    while True:
                        ticks += 1
                        await asyncio.sleep(0.005)

                ticker = asyncio.create_task(tick())
                send = asyncio.create_task(rdv.asend("full", big, timeout=timeout))
                await asyncio.sleep(0.1)
                assert not send.done() and ticks >= 5  # the loop runs while it waits
                del_view = rdv.recv("full", timeout=5)
                del del_view  # frees the space
                await send
                ticker.cancel()
                with pytest.raises(shmrdv.RendezvousTimeout):
                    await rdv.asend("full", big, timeout=0.05)

            asyncio.run(main())
        finally:
            rdv.unlink()
