"""What a default container gives (a 64 MiB /dev/shm) is enough for
private rendezvous of any size, the data loader with its defaults,
``shmrdv bench --smoke``, a Group of 8 ranks and the torch backend's DDP; a
group too big for it, and a named rendezvous that does not fit says where to
find room, and one kept on a larger tmpfs (``SHMRDV_DIR``) works, with the
CLI. Each runs in a mount namespace of its own with a fresh 64 MiB tmpfs on
/dev/shm (needs root), and must leave it empty."""
import os
import sys
import textwrap

import pytest

from ..conftest import run_with_private_shm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def run_script(tmp_path, code: str, *args: str, timeout: float = 120.0):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code) + textwrap.dedent(LEFT))
    run = run_with_private_shm([sys.executable, str(script), *args], timeout=timeout)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


LEFT = """
    if __name__ == "__main__":
        import os
        print("LEFT", sorted(os.listdir("/dev/shm")))
"""


def test_a_1_gib_private_rendezvous_works_across_a_spawned_child(tmp_path):
    out = run_script(tmp_path, """
        import multiprocessing as mp
        import numpy as np
        import shmrdv

        def child(rdv):
            rdv.send("data", np.full(128 << 20, 3, np.float32), timeout=60)  # 512 MiB

        if __name__ == "__main__":
            with shmrdv.Rendezvous(size=1 << 30) as rdv:
                sizes = []
                for _ in range(2):  # twice half of it: the arena is what it says
                    p = mp.get_context("spawn").Process(target=child, args=(rdv,))
                    p.start()
                    got = rdv.recv("data", timeout=60)
                    sizes.append(bool(got.size == 128 << 20 and got.min() == got.max() == 3))
                    del got
                    p.join(60)
                    assert p.exitcode == 0
                print("RECEIVED", sizes)
    """)
    assert "RECEIVED [True, True]" in out and "LEFT []" in out, out


def test_the_data_loader_runs_an_epoch_of_19_mib_batches_with_two_workers(tmp_path):
    out = run_script(tmp_path, """
        import numpy as np
        from shmrdv.loader import DataLoader

        N = 19 << 20 >> 2  # float32 items of 19 MiB

        class Items:
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return np.full(N, i, np.float32)

        if __name__ == "__main__":
            loader = DataLoader(Items(), batch_size=None, num_workers=2, output="numpy")  # shm_size: its default
            print("EPOCH", [int(b[0]) for b in loader if b.shape == (N,) and b.min() == b.max()])
            del loader
    """)
    assert "EPOCH [0, 1, 2, 3, 4, 5, 6, 7]" in out and "LEFT []" in out, out


def test_bench_smoke_runs(tmp_path):
    run = run_with_private_shm(["sh", "-c", f"{sys.executable} -m shmrdv bench --smoke --transports shmrdv,copyto "
                                            f"--no-growth && echo \"LEFT:[$(ls -A /dev/shm)]\""], timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| 1 MiB |" in run.stdout and "LEFT:[]" in run.stdout, run.stdout


def test_a_named_rendezvous_that_does_not_fit_says_where_to_find_room_and_shmrdv_dir_gives_it(tmp_path):
    big = tmp_path / "big"
    big.mkdir(mode=0o700)
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import os, subprocess, sys
        import shmrdv
        try:
            shmrdv.Rendezvous("job", dir="/dev/shm")  # the default arena with its index: 73,965,568 bytes
        except shmrdv.SharedMemoryFull as exc:
            print("FULL", exc)
        with shmrdv.Rendezvous("job") as rdv:  # in $SHMRDV_DIR
            rdv.send("k", [1, 2])
            print("FILE", os.path.exists(os.path.join(os.environ["SHMRDV_DIR"], "shmrdv-job")))
        cli = lambda *args: subprocess.run([sys.executable, "-m", "shmrdv", *args], capture_output=True, text=True)
        print("LS", cli("ls").stdout.splitlines()[1:])
        print("RM", cli("rm", "job").stdout.strip())
        print("AFTER", os.listdir(os.environ["SHMRDV_DIR"]))
    """) + textwrap.dedent(LEFT))
    run = run_with_private_shm(["sh", "-c", f"mount -t tmpfs -o size=256m,mode=0700 tmpfs {big} && "
                                            f"SHMRDV_DIR={big} {sys.executable} {script}"])
    assert run.returncode == 0, run.stdout + run.stderr
    full = run.stdout.split("FULL", 1)[1].splitlines()[0]
    for said in ("/dev/shm has no room", "73,965,568 bytes", "fits now", "--shm-size", "dir=", "SHMRDV_DIR",
                 "private Rendezvous()"):
        assert said in full, (said, full)
    assert "FILE True" in run.stdout and "LS ['job " in run.stdout, run.stdout
    assert "RM job: removed" in run.stdout and "AFTER []" in run.stdout and "LEFT []" in run.stdout, run.stdout


def test_a_group_of_8_ranks_fits_and_one_that_does_not_says_so(tmp_path):
    # 8 ranks' segment: 16 MiB and 20 KiB, in /dev/shm while they run;
    # 32 ranks' (64 MiB and 44 KiB) cannot fit a 64 MiB /dev/shm at all
    out = run_script(tmp_path, """
        import multiprocessing as mp
        import os
        import numpy as np
        import shmrdv

        def rank(r, results):
            with shmrdv.Group("eight", r, 8, timeout=60) as group:
                total = group.allreduce(np.full(1 << 20, r + 1, np.float32))  # 4 MiB: four rounds of buffers
                if r == 0:
                    st = os.statvfs("/dev/shm")
                    results.put((float(total.min()), float(total.max()), (st.f_blocks - st.f_bfree) * st.f_frsize))
                group.barrier()

        if __name__ == "__main__":
            results = mp.Queue()
            ranks = [mp.Process(target=rank, args=(r, results)) for r in range(8)]
            for p in ranks:
                p.start()
            print("SUM", results.get(timeout=90))
            for p in ranks:
                p.join(60)
            print("EXIT", [p.exitcode for p in ranks])
            try:
                shmrdv.Group("thirty-two", 0, 32, timeout=5)
            except shmrdv.SharedMemoryFull as exc:
                print("FULL", exc)
    """, timeout=150)
    total = eval(out.split("SUM ", 1)[1].splitlines()[0])
    assert total[:2] == (36.0, 36.0) and total[2] < 20 << 20, out
    assert "EXIT [0, 0, 0, 0, 0, 0, 0, 0]" in out and "LEFT []" in out, out
    full = out.split("FULL ", 1)[1].splitlines()[0]
    for said in ("67,153,920 bytes", "32 ranks", "a group of 31 ranks fits now", "--shm-size", "emptyDir"):
        assert said in full, (said, full)


@pytest.mark.parametrize("init", ["file", "shmrdv"])
def test_the_torch_backend_trains_ddp_with_two_ranks(tmp_path, init):
    """DDP, and point-to-point of a chunked tensor, with the ranks meeting
    through a file or through shmrdv's own Store (shmrdv://)."""
    pytest.importorskip("torch")
    meet = f"file://{tmp_path / 'store'}" if init == "file" else f"shmrdv://ddp-{os.getpid()}"
    out = run_script(tmp_path, """
        import multiprocessing as mp
        import sys
        import torch
        import torch.distributed as dist

        def rank(r, meet):
            dist.init_process_group("shmrdv", init_method=meet, rank=r, world_size=2)
            big = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB: sent in chunks
            if r == 0:
                dist.send(big, 1)
            else:
                got = torch.empty_like(big)
                dist.recv(got, 0)
                print("P2P", bool(torch.equal(got, big)), flush=True)
            torch.manual_seed(0)
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for step in range(3):
                opt.zero_grad()
                model(torch.full((8, 1024), float(r + step))).sum().backward()
                opt.step()
            weights = model.module.weight.detach().clone()
            others = [torch.empty_like(weights) for _ in range(2)]
            dist.all_gather(others, weights)
            if r == 0:
                print("SAME", bool(torch.equal(others[0], others[1])), flush=True)
            dist.destroy_process_group()

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            ranks = [ctx.Process(target=rank, args=(r, sys.argv[1])) for r in range(2)]
            for p in ranks:
                p.start()
            for p in ranks:
                p.join(120)
            print("EXIT", [p.exitcode for p in ranks])
    """, meet, timeout=170)
    assert "SAME True" in out and "P2P True" in out and "EXIT [0, 0]" in out and "LEFT []" in out, out
