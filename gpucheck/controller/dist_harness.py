"""Parent side of ``gpucheck run --distributed``: the ranks of one group and their watchdog.

Each rank is a pytest worker (the same worker as ``gpucheck run``) started with the env://
rendezvous variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``) and the ``GPUCHECK_DIST_*`` ones (:mod:`gpucheck.distributed.rank`). Under
torchrun, each gpucheck process owns the one rank torchrun gave it and starts it the same way; the
ranks' files live in one shared ``--out`` folder, so every owner sees every rank's log.

Every poll, :func:`gpucheck.distributed.analysis.diagnose` reads all ranks' collective logs and
exit codes. When it names a problem (a mismatch, a crash, a rank that left a case without a
collective the others wait in, or the per-case timeout), the watchdog dumps every rank's
Python stacks (SIGUSR1 -> faulthandler; ``py-spy dump --native`` as well when installed),
asks NCCL ranks for their flight recorder, kills every rank's process group, checks with
NVML that none of the pids still holds a GPU context, writes ONE case record with one
finding, and starts a fresh group (a new generation, a new port) for the cases not yet
recorded.

When the ranks of one group are owned by several gpucheck processes (torchrun's, one per rank;
a Ray run's, one per node: :mod:`gpucheck.controller.fleet`), the owners meet through a
:class:`~gpucheck.controller.dist_group.Meeting`: the group's files (each rank's collective
log, exit code, stacks; the rendezvous of each generation; the one finding an owner claimed).
torchrun's owners share the ``--out`` folder (the ``Meeting`` itself); a Ray run's owners
send theirs through the head. The group's plan (:class:`~.dist_group.GroupSpec`) and its
meeting point are :mod:`.dist_group`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.controller import dist_cases
from gpucheck.controller import stacks as dumps
from gpucheck.controller.deaths import crash_digest
from gpucheck.controller.dist_group import (
    GroupSpec,
    GroupStopped,
    Meeting,
    RankSpec,
    free_port,
    read_exit,
)
from gpucheck.controller.spawning import (
    WorkerSpec,
    end_left,
    gpu_orphans,
    left_note,
    spawn,
    tail,
    worker_command,
    write_skip,
)
from gpucheck.distributed import analysis, collectives
from gpucheck.distributed import rank as rank_env
from gpucheck.distributed.kinds import RANK_CRASH
from gpucheck.model import results, worker_state
from gpucheck.model.contract import NORMAL_EXITS
from gpucheck.model.fleet import node_of
from gpucheck.model.group import CollectiveEntry, GroupRecord
from gpucheck.model.kinds import HANG
from gpucheck.model.layout import RunFolder, WorkerFiles
from gpucheck.model.results import Origin, Status
from gpucheck.model.runlog import RunLog
from gpucheck.model.worker_state import WorkerState
from gpucheck.processes import Cgroup, Proc, descendants

POLL_S = 0.2
#: generations (fresh groups after a finding) before the harness gives up on the group
MAX_GENERATIONS = 25
#: seconds to let the ranks write their stacks after SIGUSR1
STACK_WAIT_S = 0.5
STATUS_OF: dict[str, Status] = {HANG.name: "hung", RANK_CRASH.name: "crashed"}
#: seconds a diagnosis waits for the owners of other ranks to confirm it before it stands
#: without them (:meth:`DistHarness._confirmed`)
CONFIRM_MAX_S = 10.0


@dataclass
class RankProc:
    spec: RankSpec
    proc: subprocess.Popen[bytes]
    stem: str
    state_path: Path
    log_path: Path
    stderr_path: Path
    trace_path: Path
    state: WorkerState = field(default_factory=WorkerState)
    cgroup: Cgroup | None = None  # the one made for it (what its cases start is in it)


class DistHarness:
    """Runs the group's cases generation by generation; returns the diagnoses it made."""

    def __init__(
        self,
        group: GroupSpec,
        out_dir: Path,
        results: Path | RunLog,
        run_id: str,
        timeout: float,
        on_update: Callable[[str], None] | None = None,
        meeting: Meeting | None = None,
    ) -> None:
        """``results``: the file the ranks append to, or the controller's log of it;
        ``meeting``: where the owners of other ranks are met (default: ``out_dir`` is shared)."""
        self.group = group
        self.out_dir = out_dir
        self.wdir = RunFolder(out_dir).workers
        self.log = results if isinstance(results, RunLog) else RunLog(results)
        self.results_path = self.log.path
        self.run_id = run_id
        self.timeout = timeout
        self.on_update = on_update
        self.procs: list[RankProc] = []
        self.generation = 0
        self.diagnoses: list[tuple[analysis.GroupFault, float]] = []
        self.notes: list[str] = []
        self.meeting = meeting or Meeting()
        self.beat = 0  # looks at the ranks (each owner's, when several own them)
        self._sighted: tuple[tuple[Any, ...], dict[int, int], float] | None = None
        #: why the run stopped the group from outside (GroupStopped), else None
        self.stopped_by: str | None = None

    # ---- processes -----------------------------------------------------------------------
    def _spawn(self, skip: list[str], again: dict[int, list[str]]) -> None:
        """This generation's ranks: each skips ``skip`` and runs ``again[rank]`` without
        recording it (:mod:`.dist_cases`)."""
        g = self.group
        self.procs = []
        generation = self.generation
        addr, port = self._rendezvous()
        for local, r in enumerate(g.ranks):
            files = self._files(r.rank)
            skip_path = write_skip(files, skip)
            again_path = write_skip(files, again.get(r.rank), files.again)
            env = g.environment(local, r, files, (addr, port), self.timeout, generation)
            spec = WorkerSpec(r.label, r.device_index, r.uuid, g.suites, g.mode, {}, g.pytest_args)
            cmd = worker_command(
                spec, self.results_path, files.state, self.run_id, skip_path, again=again_path
            )
            cgroup = Cgroup.make(files.stem)
            proc = spawn(cmd, env, files, drop=("TORCHELASTIC_USE_AGENT_STORE",), cgroup=cgroup)
            self.procs.append(
                RankProc(
                    r,
                    proc,
                    files.stem,
                    files.state,
                    files.collectives,
                    files.stderr,
                    files.nccl_trace,
                    cgroup=cgroup,
                )
            )

    def _rendezvous(self) -> tuple[str, int]:
        """Where this generation's group meets: a free port here when we own every rank;
        otherwise the owner of rank 0 publishes its host and a free port of its own to the
        meeting, and the other owners read them."""
        g = self.group
        if len(g.ranks) == g.world_size:
            return g.master_addr or "127.0.0.1", free_port()
        path = RunFolder(self.out_dir).group_master(g.mode, self.generation)
        if any(r.rank == 0 for r in g.ranks):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(f"{g.master_addr or socket.getfqdn()} {free_port('')}")
            os.replace(tmp, path)
            self.meeting.push([path])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            self.meeting.pull([path])
            self._check_stopped()
            with contextlib.suppress(OSError, ValueError):
                host, port = path.read_text().split()
                return host, int(port)
            time.sleep(0.2)
        raise RuntimeError(
            f"{path} did not appear within 120 s: --out must be a folder every node sees"
        )

    def _check_stopped(self) -> None:
        why = self.meeting.stopped()
        if why is not None:
            raise GroupStopped(why)

    def _files(self, rank: int) -> WorkerFiles:
        return RunFolder(self.out_dir).rank(rank, self.group.mode, self.generation)

    def _others(self) -> list[int]:
        """The ranks other gpucheck processes own (torchrun, Ray)."""
        owned = {r.rank for r in self.group.ranks}
        return [r for r in range(self.group.world_size) if r not in owned]

    def _views(self) -> list[analysis.RankView]:
        """Every rank as this owner knows it now (the others' ranks as their owners last sent
        them: :meth:`_confirmed` allows for that)."""
        views = []
        others = self._others()
        self.beat += 1
        for p in self.procs:
            if others:  # written before the files it vouches for are read
                WorkerFiles(self.wdir, p.stem).beat.write_text(str(self.beat))
            p.state = worker_state.read(p.state_path) or p.state
            rc = p.proc.poll()
            exit_file = WorkerFiles(self.wdir, p.stem).exit
            if rc is not None and not exit_file.exists():
                exit_file.write_text(str(rc))  # for the owners of the other ranks
            views.append(
                analysis.RankView(p.spec.rank, collectives.read(p.log_path), rc, p.state.case)
            )
        if others:
            self.meeting.push(
                x
                for p in self.procs
                for f in [WorkerFiles(self.wdir, p.stem)]
                for x in (p.log_path, f.exit, f.beat)
            )
            self.meeting.pull(
                [self._claim_path()]
                + [
                    x
                    for r in others
                    for f in [self._files(r)]
                    for x in (f.collectives, f.exit, f.beat)
                ]
            )
            self._check_stopped()
        for r in others:
            views.append(
                analysis.RankView(
                    r,
                    collectives.read(self._files(r).collectives),
                    read_exit(self._files(r).exit),
                )
            )
        return sorted(views, key=lambda v: v.rank)

    def interrupt(self) -> None:
        """Ctrl-C: stop every rank this process started, and what their cases left running."""
        seen = self._descendants()
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.proc.pid, signal.SIGKILL)
            p.proc.wait()
        self._end_left(seen)

    def _descendants(self) -> dict[int, list[Proc]]:
        """Each running rank's processes and theirs, as they are now (before it is killed)."""
        return {
            p.spec.rank: [q for d in descendants(p.state.pid or p.proc.pid) if (q := Proc.of(d))]
            for p in self.procs
            if p.proc.poll() is None
        }

    def _end_left(self, seen: dict[int, list[Proc]] | None = None) -> None:
        """End what the ranks' cases left running, in sessions of their own too (their
        process groups are ended already); a note names each."""
        for p in self.procs:
            p.state = worker_state.read(p.state_path) or p.state
            ended = end_left(p.cgroup, p.state, (seen or {}).get(p.spec.rank, []))
            p.cgroup = None  # removed
            if ended:
                self.notes.append(left_note(p.spec.label, ended))

    def _limit(self, views: list[analysis.RankView]) -> float:
        """The current case's time limit: --timeout, or the shorter one the case declared
        (``dist_timeout``: a rank stuck outside any collective looks like a slow one until
        the limit passes)."""
        declared = [t for v in views if v.alive and (t := v.case_timeout()) is not None]
        return min([self.timeout, *declared])

    def _case_age(self) -> float:
        """Seconds since the earliest rank started its current case (0 outside cases)."""
        starts = [p.state.started for p in self.procs if p.state.case and p.state.started]
        return time.time() - min(starts) if starts else 0.0

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> list[tuple[analysis.GroupFault, float]]:
        try:
            return self._generations()
        except GroupStopped as stop:
            self.interrupt()
            self.stopped_by = str(stop)
            self.notes.append(f"the group's ranks here were stopped: {stop}")
            return self.diagnoses

    def _generations(self) -> list[tuple[analysis.GroupFault, float]]:
        self.wdir.mkdir(parents=True, exist_ok=True)
        found_in: set[str] = set()  # every owner's: the record may be another owner's
        seen: float | None = None  # when the last finding was handled
        first = self.group.first_generation
        for generation in range(first, first + MAX_GENERATIONS):
            self.generation = generation
            self._spawn(*self._left(found_in, seen))
            found = self._watch()
            if found is None:
                self._end_left()
                return self.diagnoses
            diagnosis, age, mine = found
            seen = time.time()
            self._handle(diagnosis, age, mine)
            found_in |= {diagnosis.case} if diagnosis.case else set()
            if diagnosis.case is None:  # outside any case: a fresh group would fail again
                return self.diagnoses
        self.notes.append(f"gave up after {MAX_GENERATIONS} groups")
        return self.diagnoses

    def _left(self, also: set[str], before: float | None) -> tuple[list[str], dict[int, list[str]]]:
        """What this generation's ranks skip, and what each runs again unrecorded
        (:mod:`.dist_cases`), from every rank's records (the others' as their owners
        published them); ``also``: the cases of the findings so far; ``before``: when the last
        was handled (records started after it do not count)."""
        g = self.group
        done = dist_cases.recorded(self.log, self.run_id, g.mode, [r.rank for r in g.ranks], before)
        if self._others():
            folder = RunFolder(self.out_dir)
            done = dist_cases.exchange(
                done,
                g.world_size,
                lambda rank: folder.group_recorded(g.mode, self.generation, rank),
                self.meeting,
                self._check_stopped,
            )
        return dist_cases.left(done, g.world_size, also)

    def _claim_path(self) -> Path:
        return RunFolder(self.out_dir).group_finding(self.group.mode, self.generation)

    def _claim(self, d: analysis.GroupFault, age: float) -> tuple[analysis.GroupFault, float, bool]:
        """The group's one diagnosis of this generation: ours if we write the claim file
        first, else the one another owner (torchrun, another node) wrote."""
        claim = json.dumps({"diagnosis": asdict(d), "age": age}).encode()
        if not self.meeting.create(self._claim_path(), claim):
            theirs = self._claimed()
            return (theirs[0], theirs[1], False) if theirs else (d, age, False)
        return d, age, True

    def _claimed(self, pull: bool = True) -> tuple[analysis.GroupFault, float] | None:
        if pull and self._others():
            self.meeting.pull([self._claim_path()])
            self._check_stopped()
        try:
            data = json.loads(self._claim_path().read_text())
            return analysis.GroupFault(**data["diagnosis"]), float(data["age"])
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _confirmed(self, found: analysis.GroupFault | None) -> analysis.GroupFault | None:
        """``found`` once it is sure. Where other processes own ranks, what this one knows
        of theirs is as old as their last push: a diagnosis made on it holds only when it is
        made again on what each of them read after it was first made (its beat 2 on: it read
        after its push that came after the first sight), or when they are silent for
        :data:`CONFIRM_MAX_S` (an owner gone)."""
        others = self._others()
        if found is None or not others:
            self._sighted = None
            return found
        key = (found.kind, found.case, found.seq, tuple(found.cause_ranks))
        beats = {r: read_exit(self._files(r).beat) or 0 for r in others}
        if self._sighted is None or self._sighted[0] != key:
            self._sighted = (key, beats, time.monotonic())
            return None
        _, then, since = self._sighted
        if all(beats[r] >= then[r] + 2 for r in others) or (
            time.monotonic() - since > CONFIRM_MAX_S
        ):
            return found
        return None

    def _watch(self) -> tuple[analysis.GroupFault, float, bool] | None:
        self._sighted = None
        while True:
            views = self._views()
            theirs = self._claimed(pull=False)  # another owner's finding: stop ours too
            if theirs is not None:
                return theirs[0], theirs[1], False
            age = self._case_age()
            found = self._confirmed(analysis.diagnose(views, timed_out=age > self._limit(views)))
            if found is not None:
                return self._claim(found, age)
            if all(not v.alive for v in views):
                bad = [v for v in views if v.exit_code not in NORMAL_EXITS]
                if bad and len(bad) < len(views):
                    found = self._confirmed(analysis.diagnose(views, timed_out=True))
                    if found is not None:
                        return self._claim(found, age)
                    if self._sighted is not None:  # to be confirmed: look again
                        time.sleep(POLL_S)
                        continue
                if bad:  # every rank died (e.g. all at start-up)
                    v = bad[0]
                    return self._claim(
                        analysis.GroupFault(
                            RANK_CRASH.name,
                            f"rank {v.rank}'s process died ({analysis.exit_text(v)})",
                            v.current_case(),
                            [v.rank],
                            hint=analysis.CRASH_HINT,
                            positions=analysis.positions(views),
                        ),
                        age,
                    )
                return None
            if self.on_update:
                self.on_update(f"{len(views)} ranks, case {views[0].current_case() or '-'}")
            time.sleep(POLL_S)

    # ---- a finding -----------------------------------------------------------------------
    def _handle(self, d: analysis.GroupFault, age: float, mine: bool = True) -> None:
        """Stacks, flight recorder, native frames, then every rank killed (frozen first, so
        that none races on into the next cases once its peers are gone)."""
        alive = [p for p in self.procs if p.proc.poll() is None]
        pids = [(p.state.pid or p.proc.pid) for p in self.procs]
        for p in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill((p.state.pid or p.proc.pid), signal.SIGUSR1)
            if self.group.backend == "nccl":
                rank_env.request_path(p.trace_path).touch()
        # faulthandler writes at once; the NCCL dump takes a moment; other owners see the
        # claim within a poll and dump their ranks' stacks to the meeting, where the claimer
        # reads them a little later
        others = self._others()
        time.sleep(STACK_WAIT_S * (1 if not others else 5 if mine else 3))
        if others:
            self.meeting.push(
                x
                for p in self.procs
                for x in (WorkerFiles(self.wdir, p.stem).stacks, p.trace_path, p.stderr_path)
            )
        if d.kind == RANK_CRASH.name:  # the others have reached their next collective by now
            again = analysis.diagnose(self._views())
            d = again if again is not None and again.kind == d.kind else d
        # py-spy before the freeze: it stops each process itself while it reads it, and
        # cannot attach to one already stopped by SIGSTOP ("Failed to suspend process")
        native = dumps.py_spy_dumps({p.spec.rank: (p.state.pid or p.proc.pid) for p in alive})
        left = self._descendants()
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.proc.pid, signal.SIGSTOP)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.proc.pid, signal.SIGKILL)
        for p in self.procs:
            p.proc.wait()
        self._end_left(left)
        orphans = (
            gpu_orphans(pids) if any(r.device_index is not None for r in self.group.ranks) else None
        )
        if mine:  # one record per finding, by the owner that claimed it
            self.meeting.pull(
                x
                for r in others
                for f in [self._files(r)]
                for x in (f.collectives, f.exit, f.stacks, f.nccl_trace, f.stderr)
            )
            self.diagnoses.append((d, age))
            self._record(d, age, native, orphans)

    def _errors(self) -> list[tuple[int, CollectiveEntry]]:
        return [
            (r, e)
            for r in range(self.group.world_size)
            for e in collectives.read(self._files(r).collectives)
            if e.ev == "error"
        ]

    def _exit_code(self, rank: int) -> int | None:
        """How rank ``rank``'s process ended (None: running, or not known here)."""
        owned = next((p for p in self.procs if p.spec.rank == rank), None)
        return owned.proc.returncode if owned else read_exit(self._files(rank).exit)

    def _evidence(self, d: analysis.GroupFault, native: dict[int, str], orphans: str | None) -> str:
        parts = [f"--- where each rank is ---\n{d.positions}"]
        for r in range(self.group.world_size):
            if self._exit_code(r) not in (None, -signal.SIGKILL, *NORMAL_EXITS):
                parts.append(
                    f"--- rank {r} stderr (why it ended) ---\n"
                    f"{crash_digest(tail(self._files(r).stderr, 64_000))[:2500]}"
                )
        errors = [f"rank {v_rank}: #{e.seq} {e.op}: {e.error}" for v_rank, e in self._errors()]
        if errors:
            parts.append(
                "--- collectives that raised (TORCH_DISTRIBUTED_DEBUG=DETAIL checks "
                "shapes and ops across ranks) ---\n" + "\n".join(errors[:8])
            )
        for r in range(self.group.world_size):  # every rank's files, whoever owns it
            files = self._files(r)
            try:
                stacks = files.stacks.read_text(errors="replace")
            except OSError:
                stacks = ""
            stacks = (
                dumps.trim(dumps.main_thread(stacks)) or "(no stack dump: the rank was not alive)"
            )
            parts.append(f"--- rank {r} Python stack (innermost first) ---\n{stacks[:1500]}")
            if r in native:
                parts.append(f"--- rank {r} py-spy dump --native ---\n{native[r][:1500]}")
            trace = rank_env.read_trace(files.nccl_trace)
            if trace:
                last = "\n".join(
                    f"  #{e['seq']} {e['op']} {e['state']} {e['input_sizes']}" for e in trace[-5:]
                )
                parts.append(f"--- rank {r} NCCL flight recorder (last 5) ---\n{last}")
        if not dumps.py_spy_installed():
            parts.append(dumps.PY_SPY_MISSING)
        if orphans is not None:
            parts.append(orphans)
        return "\n".join(parts)

    def _record(
        self, d: analysis.GroupFault, age: float, native: dict[int, str], orphans: str | None
    ) -> None:
        cause = d.cause_ranks[0] if d.cause_ranks else self.group.ranks[0].rank
        owned = next((p for p in self.procs if p.spec.rank == cause), None)
        owner = owned or self.procs[0]
        label = owned.spec.label if owned else self.group.labels.get(cause, owner.spec.label)
        suite = owner.state.suite or ",".join(self.group.suites)
        case = d.case or f"<rank {cause} start-up>"
        evidence = self._evidence(d, native, orphans)
        node = node_of(label)
        where = f"rank {cause} is {label} on node {node}; " if node else ""
        message = f"{d.message} ({where}found after {age:.1f} s)"
        origin = Origin(self.run_id, label, self.group.mode, owned.spec.uuid if owned else None)
        finding = origin.at(suite, case).finding(
            d.kind, "error", message, op=d.op, evidence=evidence[:12000], hint=d.hint
        )
        rc = self._exit_code(cause)
        record = origin.record(
            suite,
            case,
            STATUS_OF.get(d.kind, "failed"),
            reason=d.message,
            duration_s=round(age, 3),
            exit_code=rc if rc is not None and rc >= 0 else None,
            stderr_tail=evidence[-4000:],
            findings=[finding],
            distributed=GroupRecord(
                d.kind,
                d.cause_ranks,
                d.waiting_ranks,
                d.seq,
                d.op,
                round(age, 3),
                self.group.world_size,
            ),
        )
        results.append(self.results_path, record.to_json())
