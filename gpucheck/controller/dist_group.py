"""A distributed group as the controller plans it (:class:`GroupSpec`, its ranks'
:class:`RankSpec`) and where the owners of its ranks meet (:class:`Meeting`: a folder every
owner sees; a Ray run's, :class:`gpucheck.controller.fleet_head.RayMeeting`), with the free
port of its rendezvous and the exit code a rank's owner publishes there."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpucheck.controller.spawning import thread_share
from gpucheck.distributed import rank as rank_env
from gpucheck.errors import EnvironmentProblem
from gpucheck.model.contract import DEVICE_LABEL_ENV
from gpucheck.model.layout import WorkerFiles


@dataclass
class RankSpec:
    rank: int
    label: str  # "rank0/cuda:0", "rank1/cpu"
    device_index: int | None  # CUDA index, None on CPU
    uuid: str | None = None


@dataclass
class GroupSpec:
    ranks: list[RankSpec]  # the ranks this process starts (all of them unless torchrun)
    world_size: int
    backend: str
    suites: dict[str, Path]
    mode: str
    env: dict[str, str] = field(default_factory=dict)
    pytest_args: list[str] = field(default_factory=list)
    #: the host of the group's rendezvous (the store of rank 0's owner): None for this
    #: machine (127.0.0.1 when we own every rank, else its name)
    master_addr: str | None = None
    local_world_size: int | None = None
    #: the label of every rank of the group, where other processes own some (a Ray run)
    labels: dict[int, str] = field(default_factory=dict)
    #: the number of the group's first generation (a resumed run continues after the
    #: earlier invocations': :func:`~gpucheck.controller.dist_cases.first_generation`)
    first_generation: int = 0

    def environment(
        self,
        local: int,
        r: RankSpec,
        files: WorkerFiles,
        rendezvous: tuple[str, int],
        timeout: float,
        generation: int,
    ) -> dict[str, str]:
        """The environment of rank ``r`` (the ``local``-th this process starts) in a
        generation: the env:// rendezvous variables and the ``GPUCHECK_DIST_*`` ones
        (:mod:`gpucheck.distributed.rank`), its files, its device."""
        addr, port = rendezvous
        env = {
            **thread_share(len(self.ranks)),  # the ranks on this machine share its CPUs
            **self.env,
            "RANK": str(r.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(
                os.environ.get("LOCAL_RANK", local) if len(self.ranks) == 1 else local
            ),
            "LOCAL_WORLD_SIZE": str(self.local_world_size or len(self.ranks)),
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
            rank_env.ENV_BACKEND: self.backend,
            rank_env.ENV_LOG: str(files.collectives),
            rank_env.ENV_TIMEOUT: str(timeout),
            rank_env.ENV_GENERATION: str(generation),
            rank_env.ENV_DEVICE: "cpu" if r.device_index is None else str(r.device_index),
            DEVICE_LABEL_ENV: r.label,
        }
        # TORCH_DISTRIBUTED_DEBUG=DETAIL (the user's choice, passed on) adds torch's own
        # fingerprint check of every collective; not set by default: with it, torch 2.13
        # (CPU, gloo) segfaults in DistributedDataParallel's constructor
        if self.backend == "nccl":
            # the flight recorder (TORCH_FR_BUFFER_SIZE since torch 2.11; the old name for
            # older versions)
            fr = os.environ.get("TORCH_FR_BUFFER_SIZE", "2000")
            env["TORCH_FR_BUFFER_SIZE"] = fr
            env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", fr)
            env[rank_env.ENV_TRACE] = str(files.nccl_trace)
        return env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` ("": on every interface, for ranks on other machines);
    no free port is one sentence (:class:`EnvironmentProblem`)."""
    try:
        with socket.socket() as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    except OSError as err:
        raise EnvironmentProblem(
            f"no free TCP port on {socket.gethostname()} for the distributed group's "
            f"rendezvous ({err.strerror or err})"
        ) from None


class GroupStopped(Exception):
    """The run stopped the group from outside (:meth:`Meeting.stopped`): a node was lost."""


class Meeting:
    """Where the owners of one group's ranks meet. This one is a folder every owner sees
    (torchrun's ``--out``): what one writes, the others read; nothing to send. Another
    (a Ray run's, :class:`gpucheck.controller.fleet_head.RayMeeting`) copies the files between
    the owners' own folders."""

    def push(self, paths: Iterable[Path]) -> None:
        """Let the other owners see these files of ours as they are now."""

    def pull(self, paths: Iterable[Path]) -> None:
        """Bring here the latest the other owners pushed of these files."""

    def create(self, path: Path, data: bytes) -> bool:
        """Write ``path`` unless an owner did first; True when this call wrote it."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    def stopped(self) -> str | None:
        """Why the run stopped the group from outside (as of the last pull), or None."""
        return None


def read_exit(path: Path) -> int | None:
    """The number a file holds (a rank's exit code, an owner's beat), or None."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None
