"""A DistributedDataParallel training step of a small MLP, with the backend
"shmrdv" and with "gloo", in one run: what the collectives buy a user of
torch.distributed on one host.

Each rank (spawned, pinned one per CPU when there are enough) trains the
same model on its own random batches; a step is forward, backward (DDP
allreduces the gradient buckets while it runs) and an SGD update. The time
of a step is the slowest rank's, as for the collectives."""
from typing import Any, Dict, Optional

from .collective_peers import _free_port, run_rank, run_spawned_ranks, summarize, time_calls
from .processes import SINGLE_THREADED_MATH, environment

LAYERS = (64, 128, 128, 10)  # about 26 thousand parameters (0.1 MB of gradients): the step is mostly communication
BATCH = 16
STEPS, WARMUP = 100, 10
SMOKE_STEPS = 3


def _rank(backend: str, rank: int, size: int, port: int, steps: int, warmup: int, cpu: Optional[int],
          lifetime_s: int, results: Any) -> None:
    def measure() -> Dict[str, Any]:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        if backend == "shmrdv":
            import shmrdv.torch  # noqa: F401  (registers the backend)
        torch.set_num_threads(1)
        torch.manual_seed(0)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
        try:
            layers = []
            for i in range(len(LAYERS) - 1):
                layers += [torch.nn.Linear(LAYERS[i], LAYERS[i + 1]), torch.nn.ReLU()]
            model = DistributedDataParallel(torch.nn.Sequential(*layers[:-1]))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            generator = torch.Generator().manual_seed(rank)
            x = torch.randn(BATCH, LAYERS[0], generator=generator)
            y = torch.randint(0, LAYERS[-1], (BATCH,), generator=generator)
            loss_fn = torch.nn.CrossEntropyLoss()

            def step() -> None:
                optimizer.zero_grad(set_to_none=False)
                loss_fn(model(x), y).backward()
                optimizer.step()

            return {"times": time_calls(step, steps, warmup, dist.barrier)}
        finally:
            dist.destroy_process_group()

    run_rank(results, f"{backend} rank {rank}", cpu, lifetime_s, measure)


def run_ddp(backend: str, world_size: int = 2, smoke: bool = False, timeout_s: float = 180.0) -> Dict[str, Any]:
    """{"median_us", "p99_us", "iters"} of a DDP step with `backend`."""
    steps, warmup = (SMOKE_STEPS, 1) if smoke else (STEPS, WARMUP)
    port = _free_port()
    with environment(dict(SINGLE_THREADED_MATH, GLOO_SOCKET_IFNAME="lo")):
        answers = run_spawned_ranks(f"ddp-{backend}", _rank, world_size, True, timeout_s,
                                    lambda rank, cpu, lifetime_s: (backend, rank, world_size, port, steps, warmup,
                                                                   cpu, lifetime_s))
    return summarize([answers[rank]["times"] for rank in range(world_size)], 0)


def compare_ddp(world_size: int = 2, smoke: bool = False) -> Dict[str, Any]:
    """Both backends, one after the other, and gloo's step time over shmrdv's."""
    shm = run_ddp("shmrdv", world_size, smoke)
    gloo = run_ddp("gloo", world_size, smoke)
    return {"shmrdv": shm, "gloo": gloo, "ratio": gloo["median_us"] / shm["median_us"]}
