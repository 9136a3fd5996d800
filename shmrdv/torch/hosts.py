"""Which ranks share a host, and the plan the backend follows across hosts.

Shared memory works only among processes that see the same ``/dev/shm``, so
"same host" is decided from what the processes exchange through torch's
Store, never from environment variables alone (a launcher's LOCAL_RANK or
a hostname may repeat across containers and machines). A rank's identity
joins three facts:

* the kernel's boot id (``/proc/sys/kernel/random/boot_id``): one per
  running kernel, so two machines never share it;
* the ``st_dev`` of ``/dev/shm``: containers on one kernel that mount a
  ``/dev/shm`` of their own get another device number, and must not try to
  meet in a segment the other cannot see;
* the hostname: a third guard (where /proc hides the boot id, say), and
  what makes a plan readable in messages. Containers that share the
  host's /dev/shm under hostnames of their own are thus told apart too:
  they meet through gloo, which is slower but never wrong.

Testing override: ``SHMRDV_TEST_HOST_ID``, when set, is appended to the
identity, so that processes on one machine that set different values act
as different hosts (their ranks then meet through gloo, over loopback).
This is how the tests fake a cluster; a real job never sets it.

The plan (``HostPlan``): hosts are numbered by their lowest rank, and the
ranks of a host in rank order give their local index. Hierarchical
collectives need the same number of ranks on every host
(``HostPlan.uniform``): rank i of every host then has a peer of local index
i on every other host, and each index's ranks form one gloo group.
"""
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

TEST_HOST_ENV = "SHMRDV_TEST_HOST_ID"
"""The testing override: a value appended to this process's host identity."""
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_SHM_DIR = "/dev/shm"
_KEY = "shmrdv/host/"
_KEY_ALL = "shmrdv/hosts"


def testing_host_id() -> Optional[str]:
    """The testing override's value, or None when unset (or empty)."""
    return os.environ.get(TEST_HOST_ENV) or None


def host_identity() -> str:
    """This process's host identity: boot id, /dev/shm's device, hostname
    (and the testing override, when set)."""
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:
        boot = "no-boot-id"
    try:
        shm = str(os.stat(_SHM_DIR).st_dev)
    except OSError:
        shm = "no-dev-shm"
    identity = f"{boot}/{shm}/{os.uname().nodename}"
    override = testing_host_id()
    return identity if override is None else f"{identity}/test:{override}"


def exchange_identities(store, rank: int, size: int) -> List[str]:
    """Every rank's host identity, in rank order, through the Store: each
    rank sets its own key, rank 0 reads them all and publishes the list,
    the others read that one key (size reads in all, not size squared;
    reads wait as the Store waits)."""
    store.set(f"{_KEY}{rank}", host_identity())
    if rank == 0:
        every = [store.get(f"{_KEY}{r}").decode() for r in range(size)]
        store.set(_KEY_ALL, json.dumps(every))
        return every
    return json.loads(store.get(_KEY_ALL).decode())


@dataclass(frozen=True)
class HostPlan:
    """Where every rank of a group lives, seen from one rank.

    ``hosts[h]`` holds the group ranks on host h, in rank order; hosts are
    ordered by their lowest rank."""

    hosts: Tuple[Tuple[int, ...], ...]
    rank: int
    _where: Dict[int, Tuple[int, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = {r: (h, i) for h, ranks in enumerate(self.hosts) for i, r in enumerate(ranks)}
        object.__setattr__(self, "_where", where)

    @property
    def host(self) -> int:
        """The index of this rank's host."""
        return self._where[self.rank][0]

    @property
    def local_rank(self) -> int:
        """This rank's index among its host's ranks."""
        return self._where[self.rank][1]

    @property
    def local_size(self) -> int:
        return len(self.hosts[self.host])

    @property
    def single_host(self) -> bool:
        return len(self.hosts) == 1

    @property
    def uniform(self) -> bool:
        """Whether every host has as many ranks (what the hierarchy needs)."""
        return len({len(h) for h in self.hosts}) == 1

    def locate(self, rank: int) -> Tuple[int, int]:
        """(host index, local index) of a group rank."""
        return self._where[rank]

    def peers(self) -> Tuple[int, ...]:
        """The group ranks with this rank's local index, one per host in
        host order (a uniform plan's gloo group of this rank)."""
        return tuple(h[self.local_rank] for h in self.hosts)

    def order(self) -> List[int]:
        """The group rank of item ``i * len(hosts) + h`` once every local
        rank i has gathered its peers' items (host h's local rank i)."""
        return [h[i] for i in range(self.local_size) for h in self.hosts]

    def describe(self) -> str:
        return " | ".join(f"host {h}: ranks {list(ranks)}" for h, ranks in enumerate(self.hosts))


def plan_hosts(identities: Sequence[str], rank: int) -> HostPlan:
    """The plan for the ranks whose host identities are given (in rank order)."""
    groups: Dict[str, List[int]] = {}
    for r, identity in enumerate(identities):
        groups.setdefault(identity, []).append(r)
    hosts = tuple(sorted((tuple(ranks) for ranks in groups.values()), key=lambda ranks: ranks[0]))
    return HostPlan(hosts, rank)


__all__ = ["HostPlan", "TEST_HOST_ENV", "exchange_identities", "host_identity", "plan_hosts", "testing_host_id"]
