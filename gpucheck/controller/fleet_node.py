"""The node side of ``gpucheck run --ray``: what one Ray task does on one node.

:func:`discover` names the node's targets (its GPUs, or ``cpu`` with ``--cpu-only``) as
``<node>/<label>`` and says which suites can run there. :func:`run_node` runs the local
controller's passes on them (the same workers, isolation, modes, detectors and wrong-device
re-runs as ``gpucheck run`` on one machine), in a run folder of its own on the node, holding
the node's device locks; a :class:`Forwarder` thread sends every complete line the workers
append (results, their plans among them, re-runs, NVML timeline) to the head's collector as
they are written. Only records go over the network. :func:`run_group` runs this node's ranks
of a distributed group (``--ray --distributed``) with the distributed harness, meeting the
other nodes' owners through the head.

Nothing here imports Ray: the head wraps these functions into tasks
(:mod:`gpucheck.controller.fleet`), and the collector is any object whose ``append`` method
has a ``.remote``.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpucheck.controller import devlock, pipeline
from gpucheck.controller.config import (
    DEFAULT_MODES,
    RunConfig,
    Target,
    choose_targets,
    plan_passes,
    select_runnable,
)
from gpucheck.controller.dist_group import GroupSpec, Meeting, free_port
from gpucheck.controller.dist_harness import DistHarness
from gpucheck.errors import UsageProblem
from gpucheck.model import modes
from gpucheck.model.fleet import device_name
from gpucheck.model.layout import RunFolder, open_regular
from gpucheck.model.modes import tool_of
from gpucheck.model.results import BAD_STATUSES
from gpucheck.model.runlog import RunLog
from gpucheck.sanitizer import command as sanitizer_cmd

#: seconds between two looks of the forwarder at the node's files
FORWARD_S = 0.5
#: the files whose lines go to the head, by the name the collector knows them by
FORWARDED = ("results", "rerun", "timeline")


@dataclass
class NodeTargets:
    """What :func:`discover` found on a node."""

    node: str
    targets: list[Target]
    visible: int  # CUDA devices visible to the task (0 with --cpu-only)
    notes: list[str]
    not_runnable: dict[str, str]
    torch: str = ""  # torch's version there (--distributed: every node needs the same)


def asked_modes(cfg: RunConfig) -> tuple[str, ...]:
    """The modes asked for (the default ones when none was)."""
    return tuple(dict.fromkeys(cfg.modes)) or DEFAULT_MODES


def _modes(cfg: RunConfig) -> tuple[str, ...]:
    asked = asked_modes(cfg)
    return tuple(m for m in asked if m != "nvml") if cfg.cpu_only else asked


def discover(cfg: RunConfig, node: str, suites: dict[str, Path]) -> NodeTargets:
    """The node's targets, named with the node, and the suites that cannot run there."""
    missing = [f"{n} ({p})" for n, p in suites.items() if not Path(p).exists()]
    if missing:
        raise UsageProblem(
            f"node {node} has no {', '.join(missing)}: under --ray every node needs the "
            "suites at the same path as the head (a shared folder, or the same image)"
        )
    targets, notes, _, inv = choose_targets(cfg)
    _, not_runnable = select_runnable(cfg, suites)
    torch = ""
    if cfg.distributed:
        free_port("")  # a rendezvous can be held here, else one sentence
        try:
            import torch as torch_mod
        except ImportError:
            raise UsageProblem(
                f"node {node} has no torch: --distributed needs it on every node"
            ) from None
        torch = str(torch_mod.__version__)
    return NodeTargets(
        node,
        [(device_name(node, label), i, u, name) for label, i, u, name in targets],
        len(inv.devices) if inv else 0,
        [f"{node}: {n}" for n in notes],
        not_runnable,
        torch,
    )


def passes(cfg: RunConfig, visible: int) -> list[tuple[str, str | None]]:
    """The passes of a node with ``visible`` CUDA devices."""
    return plan_passes(_modes(cfg), visible) or [(modes.BARE, None)]


class Forwarder:
    """Sends what the node's workers append to the head's collector, line by line as they
    complete (a thread; :meth:`stop` sends the rest)."""

    def __init__(self, folder: Path, collector: Any, start: dict[str, int]) -> None:
        run = RunFolder(folder)
        self.paths = {"results": run.results, "rerun": run.rerun, "timeline": run.timeline}
        self.collector = collector
        self.offsets = {k: start.get(k, 0) for k in FORWARDED}
        self.last: Any = None  # the last call sent (waited for at the end: calls keep order)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpucheck-forward", daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(FORWARD_S):
            self.send()

    def send(self) -> None:
        for kind, path in self.paths.items():
            f = open_regular(path)
            if f is None:
                continue
            with f:
                f.seek(self.offsets[kind])
                data = f.read()
            whole = data[: data.rfind(b"\n") + 1]
            if whole:
                self.offsets[kind] += len(whole)
                self.last = self.collector.append.remote(kind, whole)

    def stop(self) -> Any:
        """Stop the thread, send what is left; the last call's reference (to wait for)."""
        self._stop.set()
        self._thread.join(timeout=10)
        self.send()
        return self.last


def tidy(local: Path, seed: bytes, stopped: bool, what: str) -> list[str]:
    """The node's folder ``local`` removed where nothing in it is worth a look (the node was
    not stopped, and every case it recorded after ``seed`` passed or was skipped, without an
    error); else left on the node, and a note says where (``what`` it holds)."""
    log = RunLog(RunFolder(local).results)
    log.offset = len(seed)
    recorded = log.refresh(final=True)
    if stopped or log.unreadable or any(r.status in BAD_STATUSES or r.errors() for r in recorded):
        return [f"its {what} are in {local} on that node"]
    shutil.rmtree(local, ignore_errors=True)
    return []


def run_node(
    cfg: RunConfig,
    node: str,
    run_id: str,
    collector: Any,
    seed: bytes,
    suites: dict[str, Path],
    visible: int,
) -> dict[str, Any]:
    """Run every pass on the node's targets; its records go to ``collector`` as they are
    written. ``seed``: the run's header and the records the node's devices already have
    (``--resume``: they are not run again). Returns the node's notes, whether it was stopped,
    and the last forwarding call (the head waits for it)."""
    local = Path(tempfile.mkdtemp(prefix="gpucheck-node-"))
    folder = RunFolder(local)
    folder.results.write_bytes(seed)
    found = discover(cfg, node, suites)
    notes: list[str] = []
    sanitizer = sanitizer_cmd.find() if any(tool_of(m) for m in _modes(cfg)) else None
    forwarder = Forwarder(local, collector, {"results": len(seed)}).start()
    interrupted = False
    try:
        with devlock.held(found.targets, None, cfg.wait_for_devices, notes):
            run = pipeline.Run.in_folder(replace(cfg, quiet=True), local, run_id, notes)
            run.passes = passes(cfg, visible)
            run.targets = found.targets
            run.suites = {n: p for n, p in suites.items() if n not in found.not_runnable}
            run.sanitizer = sanitizer
            run.gpus = visible
            interrupted = run.device_passes()
    finally:
        last = forwarder.stop()
    notes += tidy(local, seed, interrupted, "workers' files (logs, state)")
    return {"notes": [f"{node}: {n}" for n in notes], "interrupted": interrupted, "last": last}


def run_group(
    cfg: RunConfig,
    node: str,
    run_id: str,
    collector: Any,
    meeting: Meeting,
    seed: bytes,
    group: GroupSpec,
) -> dict[str, Any]:
    """Run this node's ranks of a distributed group (``group.ranks``, global rank numbers)
    with the distributed harness: its watchdog, its one finding per fault, meeting the other
    nodes' owners through ``meeting``. Records go to ``collector`` as :func:`run_node`'s do;
    returns the same."""
    local = Path(tempfile.mkdtemp(prefix="gpucheck-node-"))
    folder = RunFolder(local)
    folder.results.write_bytes(seed)
    notes: list[str] = []
    targets = [(r.label, r.device_index, r.uuid, None) for r in group.ranks]
    forwarder = Forwarder(local, collector, {"results": len(seed)}).start()
    harness = DistHarness(group, local, folder.results, run_id, cfg.timeout, meeting=meeting)
    try:
        with devlock.held(targets, None, cfg.wait_for_devices, notes):
            interrupted = pipeline.run_until_interrupted(harness)
    finally:
        last = forwarder.stop()
    notes += harness.notes
    faults = bool(harness.diagnoses) or harness.generation != group.first_generation
    stopped = interrupted or harness.stopped_by is not None or faults
    notes += tidy(local, seed, stopped, "ranks' files (logs, state, stacks)")
    return {
        "notes": [f"{node}: {n}" for n in notes],
        "interrupted": interrupted,  # not when the head stopped it: the head knows why
        "last": last,
    }
