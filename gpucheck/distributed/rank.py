"""Worker side: this process as one rank of a ``torch.distributed`` group.

The same code runs whoever started the process: ``gpucheck run --distributed`` (which sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` for an env://
rendezvous) or ``torchrun`` (which sets the same variables); the ``GPUCHECK_DIST_*``
variables name the backend, this rank's device, its collective log and the per-case timeout.

Between cases the ranks meet at a *case boundary* through the rendezvous store, not through
a collective: a rank that finishes a case early (because it skipped a collective) waits
there instead of pairing its next case's collectives with the ones the others are still in,
and the parent sees it waiting there in the collective log.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucheck.distributed import collectives

ENV_BACKEND = "GPUCHECK_DIST_BACKEND"
ENV_DEVICE = "GPUCHECK_DIST_DEVICE"  # CUDA index of this rank, or "cpu"
ENV_LOG = "GPUCHECK_DIST_LOG"
ENV_TIMEOUT = "GPUCHECK_DIST_TIMEOUT"
ENV_GENERATION = "GPUCHECK_DIST_GENERATION"
ENV_TRACE = "GPUCHECK_DIST_NCCL_TRACE"  # where the NCCL flight recorder dump goes
#: seconds the process group waits in a collective beyond the case timeout: the watchdog
#: (parent) must act first, with the stacks, not the backend's own timeout
PG_TIMEOUT_MARGIN = 120.0


class DistSetupError(RuntimeError):
    """The ranks cannot run the distributed cases (bad environment, ranks out of step)."""


@dataclass
class Rank:
    """This process's place in the group; what a distributed case needs."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any  # torch.device
    timeout: float
    generation: int
    log: collectives.CollectiveLog | None = None
    store: Any = None
    _step: int = 0

    @property
    def label(self) -> str:
        return f"rank{self.rank}/{self.device}"

    def boundary(self, case: str, phase: str) -> None:
        """Wait until every rank reaches the start (``phase="start"``) or end of ``case``.

        At the start every rank must be at the same case; at the end every rank must have
        issued as many collectives. If not, this rank stays here (until the parent's
        watchdog, which reads the logs, ends the group): an NCCL collective that one rank
        skipped is only queued on the others, and going on would pair it with the next
        case's collectives.
        """
        if phase == "start":
            self._step += 1
        key = f"gpucheck/g{self.generation}/s{self._step}/{phase}/"
        seq = self.log.seq if self.log is not None else 0
        self.store.set(key + str(self.rank), f"{seq}|{case}")
        limit = datetime.timedelta(seconds=self.timeout + PG_TIMEOUT_MARGIN)
        self.store.wait([key + str(r) for r in range(self.world_size)], limit)
        got = {
            r: self.store.get(key + str(r)).decode().split("|", 1) for r in range(self.world_size)
        }
        if phase == "start" and len({c for _, c in got.values()}) > 1:
            raise DistSetupError(
                "the ranks run different cases at the same step (a case collected or "
                "deselected on some ranks only): "
                + "; ".join(f"rank {r}: {c}" for r, (_, c) in got.items())
            )
        if phase == "end" and len({n for n, _ in got.values()}) > 1:
            time.sleep(limit.total_seconds())
            raise DistSetupError(
                f"the ranks issued different numbers of collectives in {case}: "
                + "; ".join(f"rank {r}: {n}" for r, (n, _) in got.items())
            )


def env_ranks() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) from the launcher's variables, or None outside one."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def under_torchrun() -> bool:
    """True when torchrun (torch.distributed.elastic) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "GROUP_RANK" in os.environ


_RANK: Rank | None = None


def current() -> Rank | None:
    return _RANK


def init() -> Rank:
    """Join the process group (env://) once per process; installs the collective log."""
    global _RANK
    if _RANK is not None:
        return _RANK
    import torch
    import torch.distributed as dist

    found = env_ranks()
    if found is None:
        raise DistSetupError(
            "not started as a rank: RANK and WORLD_SIZE are not set (run "
            "under `gpucheck run --distributed` or torchrun)"
        )
    rank, world, local = found
    device_env = os.environ.get(ENV_DEVICE)
    cuda = torch.cuda.is_available() and device_env != "cpu"
    backend = os.environ.get(ENV_BACKEND) or ("nccl" if cuda else "gloo")
    if cuda:
        index = int(device_env) if device_env not in (None, "") else local
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = float(os.environ.get(ENV_TIMEOUT, "900"))
    log_path = os.environ.get(ENV_LOG)
    log = collectives.install(Path(log_path), rank, str(device)) if log_path else None
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(
        backend,
        init_method="env://",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout + PG_TIMEOUT_MARGIN),
        **kwargs,
    )
    store = dist.distributed_c10d._get_default_store()
    _RANK = Rank(
        rank,
        world,
        local,
        backend,
        device,
        timeout,
        int(os.environ.get(ENV_GENERATION, "0")),
        log,
        store,
    )
    if backend == "nccl" and os.environ.get(ENV_TRACE):
        _start_trace_dumper(Path(os.environ[ENV_TRACE]))
    return _RANK


def shutdown() -> None:
    global _RANK
    import torch.distributed as dist

    if _RANK is not None and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    _RANK = None


def request_path(trace: Path) -> Path:
    return trace.with_name(trace.name + ".request")


def _start_trace_dumper(trace: Path) -> None:
    """A thread that writes the NCCL flight recorder's entries to ``trace`` when the parent
    creates ``trace.request`` (a Python signal handler would wait for the main thread, which
    is stuck in the collective)."""
    import torch

    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
    if dump is None:
        return

    def watch() -> None:
        req = request_path(trace)
        while True:
            if req.exists():
                with contextlib.suppress(Exception):
                    trace.write_bytes(dump())
                with contextlib.suppress(OSError):
                    req.unlink()
            time.sleep(0.2)

    threading.Thread(target=watch, name="gpucheck-nccl-trace", daemon=True).start()


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The NCCL flight recorder's entries of one rank (``_dump_nccl_trace``'s pickle), each
    reduced to seq, op, state and sizes; [] when there is none."""
    import io
    import pickle

    def same(value: Any, *_: Any) -> Any:
        return value

    # what TorchScript's pickler names around plain lists (torch.jit._pickle: each returns its
    # first argument), done here without importing torch
    builders = {
        ("torch.jit._pickle", n): same
        for n in ("build_intlist", "build_doublelist", "build_boollist", "restore_type_tag")
    }

    class PlainData(pickle.Unpickler):
        """Containers, strings and numbers only: a pickle that names any other class or
        function (a file put there by someone else) is refused, never run."""

        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in builders:
                return builders[(module, name)]
            raise pickle.UnpicklingError(f"{module}.{name} is not plain data")

    try:
        data = PlainData(io.BytesIO(path.read_bytes())).load()
    except Exception:
        return []
    out = []
    for e in data.get("entries", []) if isinstance(data, dict) else []:
        out.append(
            {
                "seq": e.get("collective_seq_id"),
                "op": e.get("profiling_name"),
                "state": e.get("state"),
                "input_sizes": e.get("input_sizes"),
                "pg": e.get("process_group"),
            }
        )
    return out
