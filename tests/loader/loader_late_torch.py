"""A map-style dataset whose module imports no torch: its code imports torch
only when it runs (in a spawned worker: after the worker has started)."""


class LateTorch:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        import torch

        info = torch.utils.data.get_worker_info()
        return (-1 if info is None else info.id), torch.get_num_threads()
