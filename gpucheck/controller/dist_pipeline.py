"""``gpucheck run --distributed``: the ranks of one torch.distributed group, one per device.

Started by hand, gpucheck spawns ``world_size`` ranks on this machine (one per target GPU with
NCCL, or ``--world-size`` CPU ranks with gloo under ``--cpu-only``) and watches them as one
group (:class:`gpucheck.controller.dist_harness.DistHarness`). Started by torchrun (``torchrun
--nnodes N --nproc-per-node G -m gpucheck run --distributed --out SHARED``), each gpucheck
process owns the rank torchrun gave it, on GPU ``LOCAL_RANK``; the run folder must be one
every node sees, where global rank 0 writes the header, the end record and the reports.
Over a Ray cluster (``--ray --distributed``) the head starts the ranks of every node
(:mod:`gpucheck.controller.fleet`) with the same harness.
"""

from __future__ import annotations

import datetime
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.text import Text

from gpucheck.controller import devlock, dist_cases
from gpucheck.controller import suites as suites_mod
from gpucheck.controller.config import (
    DIST_MODE,
    RunConfig,
    Target,
    choose_targets,
    header,
    make_console,
    prepare_out,
)
from gpucheck.controller.dist_group import GroupSpec, RankSpec
from gpucheck.controller.dist_harness import DistHarness
from gpucheck.controller.pipeline import Run, run_until_interrupted, sigterm_as_interrupt
from gpucheck.distributed import analysis
from gpucheck.distributed import rank as rank_env
from gpucheck.errors import UsageProblem
from gpucheck.model import clock, results
from gpucheck.model.contract import CURRENT_ENV, TARGET_CURRENT
from gpucheck.model.fleet import device_name
from gpucheck.model.layout import RunFolder
from gpucheck.model.runlog import Resume, RunHeader, RunLog

MODE = DIST_MODE
BACKENDS = ("nccl", "gloo")


def rank_spec(rank: int, index: int | None, uuid: str | None = None, node: str = "") -> RankSpec:
    """Global rank ``rank`` on CUDA device ``index`` (None: a CPU rank), named
    ``rank1/cuda:1`` (``node-a/rank1/cuda:1`` on node ``node`` of a Ray run)."""
    label = f"rank{rank}/" + ("cpu" if index is None else f"cuda:{index}")
    return RankSpec(rank, device_name(node, label) if node else label, index, uuid)


def backend_of(cfg: RunConfig) -> str:
    """The group's backend: ``--backend``, else nccl on GPUs and gloo with ``--cpu-only``."""
    backend = cfg.backend
    if backend is not None and backend not in BACKENDS:
        raise UsageProblem(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if cfg.cpu_only and backend == "nccl":
        raise UsageProblem("--backend nccl needs GPUs; drop --cpu-only")
    return "gloo" if cfg.cpu_only else backend or "nccl"


def check_world(cfg: RunConfig, ranks: int, where: str) -> None:
    """``--world-size``, when given, must be the one rank per device that a GPU run (or any
    Ray run) has."""
    if cfg.world_size is not None and cfg.world_size != ranks:
        raise UsageProblem(
            f"--world-size {cfg.world_size} but {ranks} {where}: a run on GPUs has one rank "
            "per device"
        )


def _ranks(cfg: RunConfig) -> tuple[list[RankSpec], int, str, list[Target], list[str], Any]:
    """The ranks to start here, the world size, the backend, targets/notes/inventory."""
    backend = backend_of(cfg)
    targets, notes, _, inv = choose_targets(cfg)
    if cfg.cpu_only:
        world = cfg.world_size or 2
        ranks = [rank_spec(r, None) for r in range(world)]
        return ranks, world, backend, targets, notes, inv
    check_world(cfg, len(targets), "target device(s) (choose them with --device)")
    ranks = [rank_spec(r, index, u) for r, (_, index, u, _) in enumerate(targets)]
    return ranks, len(ranks), backend, targets, notes, inv


def run(cfg: RunConfig, previous: RunHeader | None) -> int:
    """Run the group (see the module docstring); returns the exit code of the run."""
    if rank_env.under_torchrun():
        return _run_torchrun(cfg)
    return DistRun(cfg, previous).execute()


class DistRun(Run):
    """A run of one group of ranks started here: the steps of :class:`Run`, with the ranks
    as its plan and the group as its one pass."""

    header_after_start = False  # its group's pass writes no header

    def __init__(self, cfg: RunConfig, previous: RunHeader | None = None) -> None:
        super().__init__(cfg, previous)
        self.ranks: list[RankSpec] = []
        self.world = 0
        self.backend = ""
        self.found: list[tuple[analysis.GroupFault, float]] = []

    def plan(self) -> None:
        self.ranks, self.world, self.backend, _, self.notes, self.inv = _ranks(self.cfg)
        self.requested = (
            self.cfg.suite_paths
            if self.cfg.suite_paths is not None
            else suites_mod.resolve(self.cfg.suites or suites_mod.distributed())
        )
        self.targets = [(r.label, r.device_index, r.uuid, None) for r in self.ranks]
        self.asked = (MODE,)
        self.passes = [(MODE, None)]

    def plan_passes(self) -> None:
        """One pass: the group (planned with the ranks)."""

    def open_folder(self, lock: devlock.Held) -> None:
        self.out = self.cfg.resume if self.cfg.resume is not None else prepare_out(self.cfg.out)
        lock.note_folder(self.out)
        self.suites = self.requested
        self.notes.append(
            f"distributed: {self.world} rank(s), backend {self.backend}, env:// rendezvous "
            "on this machine"
        )

    def run_passes(self) -> bool:
        group = GroupSpec(
            self.ranks,
            self.world,
            self.backend,
            self.requested,
            MODE,
            group_env(self.cfg),
            self.cfg.pytest_args,
            first_generation=dist_cases.first_generation(self.out, MODE, self.world),
        )
        return self.watch(group)

    def watch(self, group: GroupSpec) -> bool:
        """The group to its end, a line per rank and per finding; True when stopped."""
        harness = DistHarness(group, self.out, self.log, self.run_id, self.cfg.timeout)
        stopped = False
        try:
            with sigterm_as_interrupt(self.stopped):
                self.found = harness.run()
        except KeyboardInterrupt:
            harness.interrupt()
            stopped = True
            self.found = harness.diagnoses
        self.notes.extend(harness.notes)
        rank_lines(self.console, group, self.log, self.run_id, stopped)
        for d, age in self.found:
            self.console.print(
                Text.assemble((d.kind, "red"), f" after {age:.1f} s in {d.case}: {d.message}")
            )
        return stopped


#: ranks of the distributed pass that ``gpucheck run --cpu-only`` adds to its default suites
CPU_PASS_WORLD = 2


def cpu_pass(cfg: RunConfig, out: Path, results_path: Path, run_id: str, notes: list[str]) -> bool:
    """The distributed suites (``dist``) as one gloo group of CPU ranks, in a run that is
    already under way (the default suites of ``gpucheck run --cpu-only``): its records go
    into that run's results; the caller diagnoses and reports. True after Ctrl-C/SIGTERM."""
    requested = suites_mod.resolve(suites_mod.distributed())
    ranks = [rank_spec(r, None) for r in range(CPU_PASS_WORLD)]
    group = GroupSpec(
        ranks,
        CPU_PASS_WORLD,
        "gloo",
        requested,
        MODE,
        group_env(cfg),
        cfg.pytest_args,
        first_generation=dist_cases.first_generation(out, MODE, CPU_PASS_WORLD),
    )
    log = RunLog(results_path)
    harness = DistHarness(group, out, log, run_id, cfg.timeout)
    console = make_console()
    console.print(
        Text(
            f"{MODE}: the distributed suite ({', '.join(requested)}) as one gloo "
            f"group of {CPU_PASS_WORLD} CPU ranks"
        ),
        soft_wrap=True,
    )
    interrupted = True  # until the harness returns: an error ends the pass as a stop does
    try:
        interrupted = run_until_interrupted(harness)
        return interrupted
    finally:
        notes.extend(harness.notes)
        names = ", ".join(requested)
        ran = rank_lines(console, group, log, run_id, interrupted)
        if not ran:
            notes.append(
                f"--cpu-only: the distributed suite ({names}) did not run: the run "
                "was stopped before its first case finished"
            )
        else:
            notes.append(
                f"--cpu-only: the distributed suite ({names}) ran as one gloo group "
                f"of {CPU_PASS_WORLD} CPU ranks (mode {MODE})"
                + (", until the run was stopped" if interrupted else "")
            )


def rank_lines(console: Any, group: GroupSpec, log: RunLog, run_id: str, stopped: bool) -> int:
    """One line per rank of ``group`` when its pass ends (``rank0/cpu dist: 5 case(s)
    recorded``), as a worker of a device pass gets one, on a terminal or not. Returns the
    number of the pass's case records."""
    log.refresh(final=True)
    recorded = Counter(r.device for r in log.cases if r.run_id == run_id and r.mode == group.mode)
    for rank in group.ranks:
        console.print(
            Text(
                f"{rank.label} {group.mode}: {recorded[rank.label]} case(s) "
                f"recorded" + (", stopped" if stopped else "")
            ),
            soft_wrap=True,
        )
    return sum(recorded.values())


def group_env(cfg: RunConfig) -> dict[str, str]:
    """What every rank's environment gets besides the rendezvous."""
    env = {CURRENT_ENV: TARGET_CURRENT}
    if cfg.cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _run_torchrun(cfg: RunConfig) -> int:
    """One rank per gpucheck process, ranks and rendezvous from torchrun's variables."""
    found = rank_env.env_ranks()
    assert found is not None
    rank, world, local = found
    if cfg.world_size is not None and cfg.world_size != world:
        raise UsageProblem(f"--world-size {cfg.world_size} but torchrun started {world} ranks")
    run_key = os.environ.get("TORCHELASTIC_RUN_ID", "torchrun")
    out = cfg.out or Path("reports") / f"torchrun-{run_key}"
    results_path = RunFolder(out).results
    import torch

    gpu = torch.cuda.is_available() and not cfg.cpu_only
    backend = cfg.backend or ("nccl" if gpu else "gloo")
    label = f"rank{rank}/cuda:{local}" if gpu else f"rank{rank}/cpu"
    requested = suites_mod.resolve(cfg.suites or suites_mod.distributed())
    notes = [
        f"distributed under torchrun: {world} rank(s), backend {backend}, "
        f"{os.environ.get('LOCAL_WORLD_SIZE', '?')} per node"
    ]
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        if not results_path.exists():
            targets: list[Target] = [(f"rank{r}", None, None, None) for r in range(world)]
            results.append(
                results_path,
                header(cfg, run_key, targets, None, requested, [(MODE, None)], notes, {}, (MODE,)),
            )
        elif cfg.resume is not None:
            previous = RunLog.read(results_path).header
            run = previous.run_id if previous is not None else run_key
            results.append(results_path, Resume(run, clock.now(), notes).to_json())
    deadline = time.monotonic() + 120
    while not results_path.exists():  # rank 0 (maybe on another node) writes the header
        if time.monotonic() > deadline:
            raise UsageProblem(
                f"rank {rank}: {results_path} did not appear within 120 s: "
                "--out must be a folder every node sees"
            )
        time.sleep(0.5)
    written = RunLog.read(results_path).header  # a resumed run's records keep its run id
    run_id = written.run_id if written is not None else run_key
    first = _first_generation(rank, out, world)
    group = GroupSpec(
        [RankSpec(rank, label, local if gpu else None)],
        world,
        backend,
        requested,
        MODE,
        group_env(cfg),
        cfg.pytest_args,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        first_generation=first,
    )
    owner = DistRun(cfg)  # this process's rank of the group, in the folder rank 0 made
    owner.out, owner.run_id, owner.notes = out, run_id, notes
    owner.log = RunLog(results_path)
    stopped = owner.watch(group)
    done = RunFolder(out).owner_done(rank, first)
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text((owner.stopped[0] if owner.stopped else "Ctrl-C") if stopped else "")
    if rank != 0:  # its findings are in the shared results; global rank 0 gives the verdict
        return 0
    deadline = time.monotonic() + cfg.timeout + 120
    ends = [RunFolder(out).owner_done(r, first) for r in range(world)]
    while time.monotonic() < deadline and not all(e.exists() for e in ends):
        time.sleep(0.5)
    signals = [s for e in ends for s in [e.read_text().strip() if e.exists() else ""] if s]
    return owner.finish(signals[0] if signals else None)  # a stopped owner: resumable


def _first_generation(rank: int, out: Path, world: int) -> int:
    """The first generation of this invocation's group, the same for every owner: global
    rank 0's owner reads it from the run folder (after every generation of the run's earlier
    invocations: a resumed run's files are not taken for this one's) and hands it to the
    others through torchrun's own store (one per torchrun invocation and restart)."""
    if world == 1:
        return dist_cases.first_generation(out, MODE, world)
    from torch.distributed import TCPStore

    store = TCPStore(
        os.environ.get("MASTER_ADDR", "127.0.0.1"),
        int(os.environ.get("MASTER_PORT", "29500")),
        is_master=False,
        timeout=datetime.timedelta(seconds=120),
    )
    key = f"gpucheck/first-generation/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if rank == 0:
        store.set(key, str(dist_cases.first_generation(out, MODE, world)))
    return int(store.get(key))
