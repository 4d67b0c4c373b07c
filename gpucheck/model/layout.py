"""The run folder: where a run's records, timeline and worker files go, named in one place.

::

    RUN/results.jsonl          the records (gpucheck.model.results)
    RUN/rerun.jsonl            the wrong-device check's re-runs
    RUN/nvml_timeline.jsonl    the NVML samples of the run
    RUN/shard.json             the shard of a ``--shard I/N`` run (gpucheck.model.shard)
    RUN/ray.log                Ray's own output in a ``--ray`` run (not the console's)
    RUN/workers/STEM.*         one worker process's files (WorkerFiles)
    RUN/workers/group.*, owner*.done   a distributed group's meeting point, claimed finding,
                               and its owners' ends (RunFolder.group_master, ...)

A worker's stem is ``<device>.<mode>[.<generation>]`` (``cuda0.blocking+nvml``,
``cuda1.sanitizer-memcheck-target-current.2``) or, for a rank of a distributed group,
``rank<r>.<mode>[.<generation>]``: a generation counts the fresh processes that replaced one
that ended (a crash, a lost context, a hang). Device and mode never hold ``.`` after
sanitising, so a stem splits back into its parts (:func:`parse_stem`).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

RESULTS = "results.jsonl"
RERUN = "rerun.jsonl"
TIMELINE = "nvml_timeline.jsonl"
SHARD = "shard.json"
RAY_LOG = "ray.log"
WORKERS = "workers"
#: the reports a run writes: format -> file in the run folder (gpucheck.report.FORMATS)
REPORTS = {
    "html": "report.html",
    "json": "results.json",
    "junit": "junit.xml",
    "sarif": "results.sarif",
}
#: what a run writes when no --format is given (gpucheck.report.DEFAULT_FORMATS)
DEFAULT_REPORTS = ("html", "json", "junit")
#: extra record files a suite may leave in the run folder, shown by the report
EXTRAS = ("checkpoint_lint.jsonl", "benchmarks.jsonl")
_UNSAFE = re.compile(r"[^A-Za-z0-9_+-]")


def _safe(part: str) -> str:
    return _UNSAFE.sub("-", part.replace(":", ""))


@dataclass(frozen=True)
class RunFolder:
    """The files of one run folder."""

    path: Path

    @property
    def results(self) -> Path:
        return self.path / RESULTS

    @property
    def rerun(self) -> Path:
        return self.path / RERUN

    @property
    def timeline(self) -> Path:
        return self.path / TIMELINE

    @property
    def workers(self) -> Path:
        return self.path / WORKERS

    @property
    def shard(self) -> Path:
        return self.path / SHARD

    @property
    def ray_log(self) -> Path:
        return self.path / RAY_LOG

    def worker(self, device: str, mode: str, generation: int = 0) -> WorkerFiles:
        return WorkerFiles(self.workers, stem(device, mode, generation))

    def rank(self, rank: int, mode: str, generation: int = 0) -> WorkerFiles:
        return WorkerFiles(self.workers, stem(f"rank{rank}", mode, generation))

    def state_files(self) -> list[Path]:
        return sorted(self.workers.glob("*" + WorkerFiles.STATE))

    def next_generation(self, device: str, mode: str) -> int:
        """The generation of a worker (or rank: ``rank1``) of ``device`` in ``mode`` that
        starts now: 0 in a new run; after every one an earlier invocation of the run left
        (``--resume``), so that the last state of each chain is this invocation's."""
        chain = stem(device, mode)
        gens = [-1]
        for path in self.state_files():
            name, mode_part, generation = parse_stem(WorkerFiles.of_state(path).stem)
            if f"{name}.{mode_part}" == chain:
                gens.append(generation)
        return max(gens) + 1

    def group_recorded(self, mode: str, generation: int, rank: int) -> Path:
        """What rank ``rank`` had recorded when the group of this generation started, as its
        owner published it for the owners of the other ranks (JSON)."""
        return self.workers / f"group.{mode}.{generation}.rank{rank}.recorded.json"

    # a distributed group's files (every gpucheck process that owns ranks of it reads them)
    def group_master(self, mode: str, generation: int) -> Path:
        """Where the group of this generation meets (``host:port``, written by rank 0's
        owner)."""
        return self.workers / f"group.{mode}.{generation}.master"

    def group_finding(self, mode: str, generation: int) -> Path:
        """What the first owner that found a fault in the group claimed (JSON)."""
        return self.workers / f"group.{mode}.{generation}.finding.json"

    def owner_done(self, rank: int, generation: int = 0) -> Path:
        """Written by the process that owns ``rank`` (under torchrun) when its part of the
        invocation whose group started at ``generation`` ended."""
        return self.workers / f"owner{rank}.{generation}.done"


def open_regular(path: Path) -> BinaryIO | None:
    """A file of a run folder opened for reading, or None when it is missing or is not a
    regular file. A run folder may come from someone else: a symbolic link in it (to a file
    outside it) is not followed, a FIFO or a device is not read (reading one would block or
    never end); gpucheck writes none of them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def read_regular(path: Path, limit: int = 1 << 20) -> str | None:
    """The text of a small file of a run folder (a state or skip file; at most ``limit``
    bytes), or None (see :func:`open_regular`)."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        return f.read(limit).decode("utf-8", errors="replace")


def is_regular(path: Path) -> bool:
    """A regular file, not a link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def stem(device: str, mode: str, generation: int = 0) -> str:
    """``cuda:0``, ``blocking+nvml`` -> ``cuda0.blocking+nvml`` (``.N`` for generation N)."""
    return f"{device_in_stem(device)}.{mode_in_stem(mode)}" + (
        f".{generation}" if generation else ""
    )


def parse_stem(name: str) -> tuple[str, str, int]:
    """(device or ``rankR`` as in the stem, mode as in the stem, generation) of a stem."""
    device, _, rest = name.partition(".")
    mode, _, gen = rest.rpartition(".")
    if mode and gen.isdigit():
        return device, mode, int(gen)
    return device, rest, 0


def mode_in_stem(mode: str) -> str:
    """How a record's mode appears in its worker's stem."""
    return _safe(str(mode).replace(":", "-"))


def device_in_stem(device: str) -> str:
    return _safe(device)


@dataclass(frozen=True)
class WorkerFiles:
    """The files of one worker process (or rank) under ``RUN/workers``."""

    folder: Path
    stem: str
    STATE = ".state.json"

    @classmethod
    def of_state(cls, state: Path) -> WorkerFiles:
        return cls(state.parent, state.name.removesuffix(cls.STATE))

    def _f(self, suffix: str) -> Path:
        return self.folder / f"{self.stem}{suffix}"

    @property
    def state(self) -> Path:
        return self._f(self.STATE)

    @property
    def skip(self) -> Path:
        """Case ids already recorded: the worker deselects them (a fresh process, --resume)."""
        return self._f(".skip.txt")

    @property
    def again(self) -> Path:
        """Case ids a rank recorded already and runs again, unrecorded, for its group (a
        resumed distributed run whose other ranks have no record of them)."""
        return self._f(".again.txt")

    @property
    def only(self) -> Path:
        """Case ids to run and no others (the wrong-device check's re-run)."""
        return self._f(".only.txt")

    @property
    def stdout(self) -> Path:
        return self._f(".out.log")

    @property
    def stderr(self) -> Path:
        return self._f(".err.log")

    @property
    def cmd(self) -> Path:
        return self._f(".cmd")

    @property
    def stacks(self) -> Path:
        """Every thread's stack, written by the worker when the controller asks (hangs)."""
        return self._f(".stacks.txt")

    @property
    def beat(self) -> Path:
        """How many times the rank's owner has looked at it (a distributed group whose ranks
        several processes own: what one owner read of another's ranks is that recent)."""
        return self._f(".beat")

    @property
    def sanitizer_log_template(self) -> Path:
        """compute-sanitizer's per-process logs (``%p``: the pid; children get their own)."""
        return self._f(".sanitizer.%p.log")

    def sanitizer_logs(self) -> list[Path]:
        return sorted(self.folder.glob(f"{self.stem}.sanitizer.*.log"))

    # distributed ranks
    @property
    def collectives(self) -> Path:
        return self._f(".collectives.jsonl")

    @property
    def nccl_trace(self) -> Path:
        return self._f(".nccl_trace.pkl")

    @property
    def exit(self) -> Path:
        return self._f(".exit")
