"""``gpucheck run --ray [ADDRESS]``: the same run over every node of a Ray cluster that has
GPUs (with ``--cpu-only`` on a cluster without any, every node), into one run folder here (the
machine that runs this command: the head, or a Ray Client's with ``ray://``).

Ray places the work: one task per node (``NodeAffinitySchedulingStrategy``, the node's GPUs
as ``num_gpus``) runs the local controller there (:mod:`gpucheck.controller.fleet_node`),
whose workers' records stream to a :class:`Collector` actor on the head, from which this
process takes them into the run folder as they arrive. Devices are named with their node
(``node-a/cuda:1``); a node is named by its label ``gpucheck-node`` where it has one (``ray
start --labels``), else by its host name. After the tasks, the run ends as on one machine: the
run-level detectors over every record, the end record, the reports
(:func:`gpucheck.controller.pipeline.finish`). Ray's own output goes to the run folder's
``ray.log``, not the console (:mod:`.fleet_output`): the verdict is the console's last line.

A node lost mid-run (its task fails as Ray sees the node die) leaves a ``lost`` record naming
it and the cases its loss left without a record, from the workers' ``plan`` records
(:class:`~gpucheck.model.fleet.NodeLost`): its devices', and with ``--distributed`` every
rank's; the run ends interrupted; ``gpucheck run --resume DIR`` runs exactly those, each node
its own devices' cases (a node is known again by its name). Each node holds its GPUs' locks
(:mod:`gpucheck.controller.devlock`), so a second controller on the same fleet is refused.

With ``--distributed`` the nodes' tasks run one torch.distributed group instead
(:func:`gpucheck.controller.fleet_node.run_group`): one rank per GPU of every node (with
``--cpu-only``, one gloo CPU rank per GPU a node declares, one where it declares none),
global ranks numbered node by node in name order, the env:// rendezvous on rank 0's node (its
Ray address, a port free there). Each node's distributed harness watches its ranks and meets
the other nodes' through a :class:`Board` actor on the head (:class:`RayMeeting`): the ranks'
collective logs, exit codes and stacks, what each rank recorded, the rendezvous, the one
finding claimed; a node lost stops the others' ranks (:meth:`Board.halt`).

Ray is imported only here, only under ``--ray`` (the extra ``torch-gpucheck[ray]``, which brings
Ray Client for ``ray://`` addresses).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpucheck.controller import devlock, dist_pipeline, pipeline
from gpucheck.controller import suites as suites_mod
from gpucheck.controller.config import (
    RunConfig,
    Target,
    check_same_devices,
    header,
    make_console,
    prepare_out,
)
from gpucheck.controller.dist_group import GroupSpec, RankSpec
from gpucheck.controller.fleet_head import Board, Collector, RayMeeting, ray_module, write_batches
from gpucheck.controller.fleet_node import (
    NodeTargets,
    asked_modes,
    discover,
    passes,
    run_group,
    run_node,
)
from gpucheck.controller.fleet_output import FleetOutput
from gpucheck.errors import EnvironmentProblem, GpucheckError, UsageProblem
from gpucheck.model import clock, results
from gpucheck.model.fleet import NodeLost, node_of
from gpucheck.model.layout import RunFolder
from gpucheck.model.runlog import Resume, RunHeader, RunLog

#: the node label that names a node in device names (else its host name)
NODE_LABEL = "gpucheck-node"
#: seconds between two looks at the nodes' tasks
WAIT_S = 0.5


@dataclass(frozen=True)
class Node:
    """A node of the cluster that takes part: one with GPUs (with ``--cpu-only`` on a
    cluster where none has any, every node)."""

    node_id: str
    name: str
    gpus: int
    address: str = ""  # its IP as Ray knows it

    @property
    def ranks(self) -> int:
        """Its CPU ranks of a ``--distributed --cpu-only`` group: one per GPU it declares,
        one where it declares none."""
        return self.gpus or 1


def nodes(ray: Any, cpu_only: bool = False) -> list[Node]:
    """The live nodes that have GPUs (``cpu_only``: every live node where none has any),
    named (a name two nodes share gets their id)."""
    live = [n for n in ray.nodes() if n.get("Alive")]
    alive = [n for n in live if n.get("Resources", {}).get("GPU", 0) > 0]
    if cpu_only and not alive:
        alive = live
    names = [
        (n.get("Labels") or {}).get(NODE_LABEL) or n.get("NodeManagerHostname") or "node"
        for n in alive
    ]
    out = [
        Node(
            n["NodeID"],
            name if names.count(name) == 1 else f"{name}-{n['NodeID'][:6]}",
            int(n.get("Resources", {}).get("GPU", 0)),
            str(n.get("NodeManagerAddress") or ""),
        )
        for n, name in zip(alive, names, strict=True)
    ]
    return sorted(out, key=lambda n: n.name)


def _on(ray: Any, node: Node, **options: Any) -> dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {
        "num_gpus": node.gpus,
        "num_cpus": 0,
        "max_retries": 0,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        **options,
    }


def _why(err: BaseException) -> str:
    """One line for a task's failure: our own error's sentence, else the exception's name."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, GpucheckError):
        return str(cause)
    first = str(err).strip().splitlines()
    sentence = first[0].split(". ", 1)[0].rstrip(".") if first else ""  # not Ray's advice
    return f"{type(err).__name__}: {sentence}".strip()


def _connect(ray: Any, address: str) -> None:
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # its forwarded lines go to a log file
    options: dict[str, Any] = {"logging_level": "WARNING", "configure_logging": True}
    if address == "local":
        options["include_dashboard"] = False
    try:
        ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()
        raise EnvironmentProblem(
            f"--ray {address}: cannot reach the Ray cluster: {first[0] if first else err!r}"
        ) from err


def _found(
    ray: Any, cfg: RunConfig, fleet: list[Node], suites: dict[str, Path]
) -> list[NodeTargets]:
    task = ray.remote(discover)
    refs = [task.options(**_on(ray, n)).remote(cfg, n.name, suites) for n in fleet]
    out = []
    for node, ref in zip(fleet, refs, strict=True):
        try:
            out.append(ray.get(ref))
        except Exception as err:
            raise EnvironmentProblem(f"node {node.name}: {_why(err)}") from None
    return out


def _seed(head_line: dict[str, Any], log: RunLog | None, node: str | None) -> bytes:
    """The header and the records a node's devices already have, as the node's run starts
    (``node`` None: every node's, for a distributed group, whose ranks run the same cases)."""
    lines = [head_line]
    if log is not None:
        lines += [
            r.to_json()
            for r in log.cases
            if not r.harness_made and (node is None or node_of(r.device) == node)
        ]
    return b"".join(json.dumps(x, separators=(",", ":")).encode() + b"\n" for x in lines)


def _lost(log: RunLog, node: str, reason: str, group: bool) -> NodeLost:
    """The ``lost`` record of ``node``: the cases its loss left without a record, exactly what
    ``--resume`` runs: those its devices planned; for a distributed group (whose ranks on the
    other nodes stopped with it), those every rank of the group planned, on every rank."""
    plans = [p for p in log.plans if group or node_of(p.device) == node]
    if group:  # the group's ranks run the same cases: a rank lost before it planned too
        every = {c for p in plans for c in p.planned()}
        devices = {p.device for p in plans} | {
            d.device for d in (log.header.devices if log.header else [])
        }
        planned = {(d, suite, case, mode) for d in devices for _, suite, case, mode in every}
    else:
        planned = {c for p in plans for c in p.planned()}
    recorded = {r.key for r in log.cases}
    faults = {(r.suite, r.case, r.mode) for r in log.cases if r.distributed is not None}
    cases = sorted(
        (device, mode, case)
        for device, suite, case, mode in planned
        if (device, suite, case, mode) not in recorded and (suite, case, mode) not in faults
    )
    return NodeLost(log.run_id or "", node, reason, cases)


def run(cfg: RunConfig, previous: RunHeader | None = None) -> int:
    """Run the suites on every GPU of every node of the cluster at ``cfg.ray``; the exit
    code of the whole run."""
    for flag, given in (
        ("--shard", cfg.shard is not None),
        ("--device", bool(cfg.devices)),
    ):
        if given:
            raise UsageProblem(
                f"--ray runs every GPU of every node of the cluster, and {flag} does not "
                f"apply there: drop {flag}"
            )
    assert cfg.ray is not None
    ray = ray_module()
    requested = (
        cfg.suite_paths
        if cfg.suite_paths is not None
        else suites_mod.resolve(cfg.suites or suites_mod.distributed())
        if cfg.distributed
        else suites_mod.resolve(cfg.suites, cpu_only=cfg.cpu_only)
    )
    suites = {n: Path(p).resolve() for n, p in requested.items()}
    with FleetOutput() as output:  # Ray's own lines to the run folder's ray.log
        _connect(ray, cfg.ray)
        try:
            return _run(ray, cfg, previous, suites, output)
        finally:
            ray.shutdown()  # its last forwarded lines: into the log, before the console's end


def _left_out(cfg: RunConfig, previous: RunHeader | None) -> list[str]:
    """What the default ``--ray --cpu-only`` run leaves out of the local one's suites, and
    why, one line each: the suites that need a GPU, and the distributed suite (one group over
    the nodes is ``--ray --distributed``'s; a group per node would test no node's link)."""
    if not cfg.cpu_only or cfg.distributed or cfg.suites or previous is not None:
        return []
    if not suites_mod.defaults_are_ours():
        return []
    gpu = suites_mod.left_out_note()
    names = ", ".join(suites_mod.distributed())
    return [
        *([gpu] if gpu else []),
        f"--ray --cpu-only: the distributed suite ({names}) was not run: it runs as one "
        "group over the nodes with `gpucheck run --ray --distributed --cpu-only`",
    ]


@dataclass
class _Plan:
    """What a Ray run runs: its nodes, the targets each found and the group over them (with
    ``--distributed``), the nodes of a resumed run no longer there, the run's notes."""

    fleet: list[Node]
    found: list[NodeTargets]
    group: GroupSpec | None
    targets: list[Target]
    missing: list[str]
    notes: list[str]
    not_runnable: dict[str, str]


def _plan(ray: Any, cfg: RunConfig, previous: RunHeader | None, suites: dict[str, Path]) -> _Plan:
    """The nodes that take part (a resumed run's, known by their names), what each finds
    to run, and the group over them (with ``--distributed``)."""
    notes: list[str] = _left_out(cfg, previous)
    fleet = nodes(ray, cfg.cpu_only)
    if not fleet:
        raise EnvironmentProblem(
            f"--ray {cfg.ray}: no node of the Ray cluster has a GPU (--cpu-only runs on "
            "nodes without one)"
        )
    missing: list[str] = []
    if previous is not None:  # the nodes of the run, known by their names
        before = {node_of(d.device) for d in previous.devices}
        missing = sorted(str(n) for n in before - {n.name for n in fleet} if n)
        extra = [n.name for n in fleet if n.name not in before]
        fleet = [n for n in fleet if n.name in before]
        notes += [
            f"--resume: node {n} is not in the cluster: its cases did not run" for n in missing
        ]
        notes += [f"--resume: node {n} joined after the run started: not used" for n in extra]
    found = _found(ray, cfg, fleet, suites)
    group = plan_group(cfg, fleet, found, suites) if cfg.distributed else None
    if group is not None:
        notes.append(
            f"distributed: {group.world_size} rank(s) on {len(fleet)} node(s), backend "
            f"{group.backend}, env:// rendezvous on node {fleet[0].name} "
            f"({group.master_addr or 'its host name'}, a free port there)"
        )
    targets: list[Target] = (
        [(r.label, r.device_index, r.uuid, None) for r in group.ranks]
        if group is not None
        else [t for f in found for t in f.targets]
    )
    if previous is not None:
        check_same_devices(previous, targets)
    not_runnable = {k: v for f in found for k, v in f.not_runnable.items()}
    notes += [n for f in found for n in f.notes]
    return _Plan(fleet, found, group, targets, missing, notes, not_runnable)


def _begin(
    cfg: RunConfig,
    plan: _Plan,
    folder: RunFolder,
    previous: RunHeader | None,
    suites: dict[str, Path],
) -> tuple[str, dict[str, Any], RunLog | None]:
    """The run's first line in its folder (a fresh run's header, a resumed one's ``resume``
    record): its run id, its header (each node's run starts from it) and a resumed run's
    records."""
    if previous is not None:
        log = RunLog.read(folder.results)
        resume = Resume(previous.run_id, clock.now(), plan.notes, plan.not_runnable)
        results.append(folder.results, resume.to_json())
        return previous.run_id, previous.raw, log
    run_id = uuid.uuid4().hex[:12]
    all_passes: list[tuple[str, str | None]] = (
        [(dist_pipeline.MODE, None)]
        if plan.group is not None
        else list(dict.fromkeys(p for f in plan.found for p in passes(cfg, f.visible)))
    )
    first = header(
        cfg,
        run_id,
        plan.targets,
        None,
        suites,
        all_passes,
        plan.notes,
        plan.not_runnable,
        (dist_pipeline.MODE,) if plan.group is not None else asked_modes(cfg),
    )
    results.append(folder.results, first)
    return run_id, first, None


def _starter(
    ray: Any,
    cfg: RunConfig,
    plan: _Plan,
    run_id: str,
    first: dict[str, Any],
    log: RunLog | None,
    suites: dict[str, Path],
) -> Callable[[Node, Any, Any], Any]:
    """What starts a node's task: its local run, or its part of the distributed group."""
    node_task, group_task = ray.remote(run_node), ray.remote(run_group)
    visible = {f.node: f.visible for f in plan.found}
    group = plan.group

    def start(n: Node, collector: Any, board: Any) -> Any:
        if group is None:
            return node_task.options(**_on(ray, n)).remote(
                cfg, n.name, run_id, collector, _seed(first, log, n.name), suites,
                visible[n.name],
            )  # fmt: skip
        return group_task.options(**_on(ray, n)).remote(
            cfg, n.name, run_id, collector, RayMeeting(board), _seed(first, log, None),
            _part(group, n.name),
        )  # fmt: skip

    return start


def _stopped_by(stopped: list[str], failed: dict[str, str], missing: list[str]) -> str | None:
    """Why the run did not run to its end: a signal, Ctrl-C, the loss of nodes; None."""
    if stopped or failed.pop("", None) is not None:
        return stopped[0] if stopped else "Ctrl-C"
    if failed or missing:
        return f"the loss of node {', '.join(sorted([*failed, *missing]))}"
    return None


def _run(
    ray: Any,
    cfg: RunConfig,
    previous: RunHeader | None,
    suites: dict[str, Path],
    output: FleetOutput,
) -> int:
    plan = _plan(ray, cfg, previous, suites)
    console = make_console(output.console)
    with devlock.held([], cfg.resume, cfg.wait_for_devices, plan.notes) as lock:
        out = cfg.resume if cfg.resume is not None else prepare_out(cfg.out)
        lock.note_folder(out)
        folder = RunFolder(out)
        output.into(folder.ray_log)
        plan.notes.append(
            f"Ray's own output (its log lines, its tasks' output) is in {folder.ray_log}"
        )
        run_id, first, log = _begin(cfg, plan, folder, previous, suites)
        stopped: list[str] = []
        with pipeline.sigterm_as_interrupt(stopped):
            start = _starter(ray, cfg, plan, run_id, first, log, suites)
            failed = _run_tasks(ray, cfg, out, run_id, plan.fleet, start, console, plan.notes)
        if plan.group is not None and not cfg.quiet:
            dist_pipeline.rank_lines(
                console, plan.group, RunLog(folder.results), run_id, bool(stopped or failed)
            )
        run = pipeline.Run.in_folder(cfg, out, run_id, plan.notes, plan.not_runnable)
        run.console = console
        return run.finish(_stopped_by(stopped, failed, plan.missing))


def plan_group(
    cfg: RunConfig, fleet: list[Node], found: list[NodeTargets], suites: dict[str, Path]
) -> GroupSpec:
    """The distributed group over the nodes: one rank per GPU of each (``--cpu-only``: one
    CPU rank per GPU it declares, one on a node without), global ranks node by node, the
    rendezvous on rank 0's node. One torch on every node, else one sentence."""
    versions = {f.node: f.torch for f in found}
    if len(set(versions.values())) > 1:
        raise EnvironmentProblem(
            "--distributed needs the same torch on every node, and "
            + ", ".join(f"{n} has {v}" for n, v in versions.items())
        )
    ranks: list[RankSpec] = []
    for node, f in zip(fleet, found, strict=True):
        devices = (
            [(None, None)] * node.ranks if cfg.cpu_only else [(i, u) for _, i, u, _ in f.targets]
        )
        for index, uid in devices:
            ranks.append(dist_pipeline.rank_spec(len(ranks), index, uid, node.name))
    dist_pipeline.check_world(cfg, len(ranks), "GPU(s) on the cluster's nodes")
    return GroupSpec(
        ranks,
        len(ranks),
        dist_pipeline.backend_of(cfg),
        suites,
        dist_pipeline.MODE,
        dist_pipeline.group_env(cfg),
        cfg.pytest_args,
        master_addr=fleet[0].address or None,
        labels={r.rank: r.label for r in ranks},
    )


def _part(group: GroupSpec, node: str) -> GroupSpec:
    """The ranks of ``group`` that node ``node`` starts."""
    mine = [r for r in group.ranks if node_of(r.label) == node]
    return replace(group, ranks=mine, local_world_size=len(mine))


def _on_head(ray: Any, cls: type, *args: Any) -> Any:
    """An actor of ``cls`` on this (the head's) node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return (
        ray.remote(cls)
        .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
        .remote(*args)
    )


def _run_tasks(
    ray: Any,
    cfg: RunConfig,
    out: Path,
    run_id: str,
    fleet: list[Node],
    start: Callable[[Node, Any, Any], Any],
    console: Any,
    notes: list[str],
) -> dict[str, str]:
    """One task per node (``start(node, collector, board)`` starts it), watched to its end,
    the records it sends appended to the run folder as they come; the nodes that did not
    finish, with why (key ``""``: the run was interrupted here). A node that fails halts the
    board, which stops the others' ranks of a distributed group; it gets a ``lost`` record."""
    collector = _on_head(ray, Collector)
    board = _on_head(ray, Board)
    folder = RunFolder(out)
    pending = {start(n, collector, board): n for n in fleet}
    failed: dict[str, str] = {}
    lasts = []
    try:
        while pending:
            try:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_S)
                write_batches(folder, ray.get(collector.take.remote()))
            except KeyboardInterrupt:
                failed[""] = "interrupted"
                for ref in pending:
                    ray.cancel(ref)
                ready = list(pending)
            for ref in ready:
                node = pending.pop(ref)
                try:
                    done = ray.get(ref)
                except KeyboardInterrupt:
                    raise
                except Exception as err:
                    failed[node.name] = _why(err)
                    board.halt.remote(f"node {node.name} did not finish: {failed[node.name]}")
                    if not cfg.quiet:
                        console.print(f"node {node.name}: did not finish: {failed[node.name]}")
                    continue
                lasts.append(done["last"])
                notes.extend(done["notes"])
                if done["interrupted"]:
                    failed.setdefault("", "interrupted")
                if not cfg.quiet:
                    console.print(f"node {node.name}: finished")
        ray.get([x for x in lasts if x is not None])
        write_batches(folder, ray.get(collector.take.remote()))
    finally:
        ray.kill(collector)
        ray.kill(board)
    log = RunLog.read(folder.results)
    for name, why in sorted(failed.items()):
        if name:
            lost = _lost(log, name, why, group=bool(cfg.distributed))
            results.append(folder.results, lost.to_json())
    return failed
