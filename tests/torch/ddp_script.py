"""A small DDP job for torchrun: meets through ``init_method`` (argv[1]),
prints this rank's seconds from its process start to the end of the first
collective, trains two steps and checks the ranks agree."""
import sys
import time

import psutil_free_start  # noqa: F401  (sets START: this process's start time)
import torch
import torch.distributed as dist

import shmrdv.torch  # noqa: F401  (the shmrdv:// init method)

dist.init_process_group("gloo", init_method=sys.argv[1])
probe = torch.ones(1)
dist.all_reduce(probe)
first = time.time() - psutil_free_start.START
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad()
    model(torch.ones(8, 4) * (dist.get_rank() + 1)).sum().backward()
    opt.step()
weights = model.module.weight.detach().clone()
gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weights)
assert all(torch.equal(gathered[0], g) for g in gathered), "ranks disagree"
print(f"rank {dist.get_rank()} world {dist.get_world_size()} first-collective-s {first:.3f} sum {probe.item()}",
      flush=True)
dist.destroy_process_group()
