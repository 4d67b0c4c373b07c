"""Worker side: a per-rank log of every ``torch.distributed`` collective, for the watchdog.

:func:`install` wraps the collectives of ``torch.distributed`` (``all_reduce``,
``all_gather``, ``broadcast``, ``barrier``, ...) in this process. Before a call enters the
backend, one JSON line goes to the rank's log file (a
:class:`~gpucheck.model.group.CollectiveEntry`, read back by :func:`read`)::

    {"ev": "enter", "seq": 3, "op": "all_reduce", "shapes": [[4]], "dtypes": ["float32"],
     "devices": ["cuda:1"], "case": "test_ddp.py::test_step", "where": "test_ddp.py:41",
     "t": 1732412345.1}

and after it returns ``{"ev": "done", "seq": 3, ...}`` (or ``{"ev": "error", ...}`` with the
exception's first line). ``seq`` counts this rank's collectives in its process group: matching
collectives of all ranks carry the same ``seq``, so the parent
(:mod:`gpucheck.distributed.analysis`) can say which rank did not arrive at which collective,
or which ranks entered one collective with different ops or shapes. Each line is one
``write`` on a file opened with O_APPEND: a rank killed while blocked leaves every line it
wrote.

Before entering, every tensor argument must be on this rank's device (``expected_device``):
a CPU tensor (or one on another GPU) passed to an NCCL collective otherwise raises on one
rank only, or builds a second communicator, and the other ranks wait for ever (story 5). The
wrapper raises :class:`CollectiveDeviceError` naming the rank, the collective and the device
instead, and logs an ``error`` line.

Collectives issued by C++ code (DistributedDataParallel's reducer, its constructor's
broadcast) do not pass through these functions; :func:`ddp_comm_hook` logs DDP's gradient
all-reduces, and the NCCL flight recorder sees the rest on GPUs. Point-to-point calls
(``send``/``recv``) are not logged: their counts differ between ranks by design.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpucheck.model.group import CollectiveEntry
from gpucheck.model.group import read_log as read

__all__ = [
    "COLLECTIVES",
    "CollectiveDeviceError",
    "CollectiveLog",
    "current",
    "ddp_comm_hook",
    "install",
    "read",
]
#: the collectives wrapped; ``*_object`` calls are logged once (not the collectives they make)
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "monitored_barrier",
)


class CollectiveDeviceError(RuntimeError):
    """A rank passed a tensor on another device than its own to a collective."""


class CollectiveLog:
    """Appends this rank's collectives to ``path`` (one JSON object per line)."""

    def __init__(self, path: Path, rank: int, expected_device: str | None = None) -> None:
        self.path = path
        self.rank = rank
        self.expected_device = expected_device
        self.seq = 0
        self.case: str | None = None
        self.tag: str | None = None  # who issued the next collectives (e.g. a renderer)
        self._local = threading.local()
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, entry: CollectiveEntry) -> None:
        if entry.t is None:
            entry.t = round(time.time(), 4)
        line = entry.line()
        with self._lock:
            os.write(self._fd, line)

    def case_started(self, case: str, timeout: float | None = None) -> None:
        """A case begins; ``timeout``: its own time limit in seconds (``dist_timeout``
        marker), which the watchdog applies when shorter than ``--timeout``."""
        self.case = case
        self.write(
            CollectiveEntry(
                "case", self.seq, case=case, timeout=None if timeout is None else float(timeout)
            )
        )

    def case_finished(self, case: str, outcome: str, error: str | None = None) -> None:
        self.write(CollectiveEntry("case-end", self.seq, case=case, outcome=outcome, error=error))
        self.case = None

    def group_lost(self, case: str, phase: str, error: str) -> None:
        """The other ranks were gone at the ``phase`` (start or end) boundary of ``case``."""
        self.write(CollectiveEntry("group-lost", self.seq, case=case, phase=phase, error=error))

    @property
    def inside(self) -> bool:
        return bool(getattr(self._local, "depth", 0))

    def wrap(self, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with an enter line before and a done/error line after."""

        @functools.wraps(fn)
        def logged(*args: Any, **kwargs: Any) -> Any:
            if self.inside:  # a collective made by a logged one (all_gather_object's)
                return fn(*args, **kwargs)
            tensors = list(_tensors(args, kwargs))
            with self._lock:
                self.seq += 1
                seq = self.seq
            self.write(
                CollectiveEntry(
                    "enter",
                    seq,
                    op,
                    self.rank,
                    shapes=[list(t.shape) for t in tensors],
                    dtypes=[str(t.dtype).removeprefix("torch.") for t in tensors],
                    devices=[str(t.device) for t in tensors],
                    case=self.case,
                    where=_caller(),
                    tag=self.tag,
                    is_async=bool(kwargs.get("async_op")),
                )
            )
            wrong = self._wrong_device(tensors)
            if wrong is not None:
                msg = (
                    f"rank {self.rank}: {op} #{seq} got a tensor on {wrong}, but this rank "
                    f"runs on {self.expected_device}: every rank must pass tensors on its "
                    f"own device, or the other ranks wait in this collective for ever"
                )
                self.write(
                    CollectiveEntry("error", seq, op, error=msg, kind="device", case=self.case)
                )
                raise CollectiveDeviceError(msg)
            self._local.depth = 1
            try:
                out = fn(*args, **kwargs)
            except Exception as err:
                first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                self.write(
                    CollectiveEntry(
                        "error",
                        seq,
                        op,
                        case=self.case,
                        error=f"{type(err).__name__}: {first}"[:2000],
                    )
                )
                raise
            finally:
                self._local.depth = 0
            self.write(CollectiveEntry("done", seq, op))
            return out

        logged.__gpucheck_logged__ = True  # type: ignore[attr-defined]
        return logged

    def _wrong_device(self, tensors: list[Any]) -> str | None:
        if self.expected_device is None:
            return None
        for t in tensors:
            if str(t.device) != self.expected_device:
                return str(t.device)
        return None


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Any]:
    torch = sys.modules["torch"]
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _caller() -> str | None:
    """file:line of the innermost frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack(limit=16)[:-2]):
        f = frame.filename
        if "torch" + os.sep in f or f.endswith("collectives.py") or "functools" in f:
            continue
        return f"{Path(f).name}:{frame.lineno}"
    return None


_LOG: CollectiveLog | None = None


def current() -> CollectiveLog | None:
    """This process's log, once :func:`install` ran."""
    return _LOG


def install(path: Path, rank: int, expected_device: str | None = None) -> CollectiveLog:
    """Log every collective of this process to ``path`` (idempotent: a second call moves the
    log to the new path and device)."""
    global _LOG
    import torch.distributed as dist

    if _LOG is not None:
        _LOG.path, _LOG.expected_device, _LOG.rank = path, expected_device, rank
        _LOG._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return _LOG
    log = CollectiveLog(path, rank, expected_device)
    for op in COLLECTIVES:
        fn = getattr(dist, op, None)
        if fn is not None and not getattr(fn, "__gpucheck_logged__", False):
            setattr(dist, op, log.wrap(op, fn))
    _LOG = log
    return log


def ddp_comm_hook() -> Callable[[Any, Any], Any]:
    """A DDP communication hook that logs each gradient bucket's all-reduce, then averages it
    the way DDP's default hook does: ``model.register_comm_hook(None, ddp_comm_hook())``."""
    import torch
    import torch.distributed as dist

    def hook(state: Any, bucket: Any) -> Any:
        log = _LOG
        tensor = bucket.buffer()
        seq = 0
        if log is not None:
            with log._lock:
                log.seq += 1
                seq = log.seq
            log.write(
                CollectiveEntry(
                    "enter",
                    seq,
                    "all_reduce",
                    log.rank,
                    shapes=[list(tensor.shape)],
                    dtypes=[str(tensor.dtype).removeprefix("torch.")],
                    devices=[str(tensor.device)],
                    case=log.case,
                    where=f"DDP gradient bucket {bucket.index()}",
                    tag="ddp",
                    is_async=True,
                )
            )
        tensor.div_(dist.get_world_size())
        raw_all_reduce = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)
        fut = raw_all_reduce(tensor, async_op=True).get_future()

        def done(f: Any) -> Any:
            if log is not None:
                log.write(CollectiveEntry("done", seq, "all_reduce"))
            return f.value()[0]

        return fut.then(done)

    # DDP checks these annotations as objects (this module's are strings)
    hook.__annotations__ = {
        "state": object,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    return hook
