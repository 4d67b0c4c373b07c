"""``gpucheck merge DIR... [--out DIR]``: one run folder, and its reports, from the run
folders of several jobs (the shards of a CI matrix or a Slurm array, or the same suites on
several machines).

The folders must be runs of one gpucheck with one set of settings (:data:`SETTINGS`: the
modes, the suites, the detectors, the pytest arguments...), each finished (an interrupted one
is resumed first), and no case may be in two of them on the same device: each refusal is one
sentence naming the difference and the folders. The merge must be complete as well: every
shard of the plan (the shard count the folders recorded) and a record of every case each
folder planned (its workers' ``plan`` records); what is missing is named in one sentence, or,
with ``allow_incomplete``, merged into a run whose verdict is ``incomplete``: the merged header
names its parts (:class:`~gpucheck.model.runlog.RunPart`), so the missing shard is a fact of
the merged run's record, not a guess. Where the folders come from different hosts
that name a device alike (``cuda:0`` on every CI runner), each device is named with its host
(``runner-3/cuda:0``). The merged folder holds a new run: one header, every case record and
re-run record of the folders (under the new run id), their NVML timelines and extra records;
then, as at the end of a run, the run-level detectors over all of them, the end record and the
reports (:func:`gpucheck.controller.pipeline.finish`). Worker logs stay in their folders.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import gpucheck
from gpucheck.controller import pipeline
from gpucheck.controller.config import RunConfig, prepare_out
from gpucheck.errors import UsageProblem
from gpucheck.model import clock, results
from gpucheck.model.layout import EXTRAS, RESULTS, TIMELINE, RunFolder, open_regular
from gpucheck.model.results import CaseRecord
from gpucheck.model.runlog import RunHeader, RunLog, RunPart, missing_shards

#: settings of a run header's ``config`` that folders to merge must share (what was asked
#: to run and how); the devices, the output folder and the shard index may differ
SETTINGS = (
    "suites",
    "modes",
    "pytest_args",
    "cpu_only",
    "timeout",
    "nvml_interval",
    "allow_empty",
    "distributed",
    "world_size",
    "backend",
)


@dataclass
class Source:
    """One folder to merge: its records as read, and the name of each of its devices in the
    merged run."""

    folder: Path
    log: RunLog
    header: RunHeader
    rerun: RunLog
    names: dict[str, str]

    @property
    def host(self) -> str:
        return self.header.field("host") or "unknown-host"

    @property
    def shard(self) -> str | None:
        return self.header.config.shard

    def part(self) -> RunPart:
        """The folder as a part of the merged run (its header names each)."""
        return RunPart(
            str(self.folder.resolve()),
            self.host,
            self.shard,
            self.header.started_at,
            round(sum(end - start for start, end in self.log.invocations()), 3),
        )

    def setting(self, name: str) -> Any:
        """A setting of :data:`SETTINGS`, the shard count, the version or the detectors."""
        if name == "gpucheck version":
            return self.header.field("gpucheck_version")
        if name == "detectors":
            return self.header.raw.get("detectors")
        if name == "shard count":
            shard = self.header.config.shard
            return shard.partition("/")[2] if shard is not None else None
        return getattr(self.header.config, name)


def _read(folder: Path) -> Source:
    path = RunFolder(folder).results
    log = RunLog.read(path)
    if log.header is None:
        raise UsageProblem(f"cannot merge {str(folder)!r}: it holds no gpucheck run ({RESULTS})")
    end = log.end
    if end is None or end.interrupted:
        how = "was interrupted" if end is not None else "has not finished (or its controller died)"
        fix = (
            "merge the folders it was merged from again"
            if log.header.config.merged_from
            else f"`gpucheck run --resume {folder}` finishes it, then merge"
        )
        raise UsageProblem(f"cannot merge {str(folder)!r}: its run {how}; {fix}")
    return Source(folder, log, log.header, RunLog.read(RunFolder(folder).rerun), {})


def _refuse_differences(sources: list[Source]) -> None:
    first = sources[0]
    for name in ("gpucheck version", "detectors", "shard count", *SETTINGS):
        for other in sources[1:]:
            a, b = first.setting(name), other.setting(name)
            if a != b:
                raise UsageProblem(
                    f"cannot merge runs with different settings: {name} is {a!r} in "
                    f"{str(first.folder)!r} and {b!r} in {str(other.folder)!r}"
                )
    seen: dict[str, Path] = {}
    for s in sources:
        shard = s.header.config.shard
        if shard is not None:
            if shard in seen:
                raise UsageProblem(
                    f"cannot merge: shard {shard} is in both {str(seen[shard])!r} and "
                    f"{str(s.folder)!r} (each shard once)"
                )
            seen[shard] = s.folder


def _missing(sources: list[Source]) -> str | None:
    """What the merge would be without, in one sentence (None: nothing): a shard of the plan
    no folder holds, or cases a folder planned and holds no record of."""
    parts = [s.part() for s in sources]
    shards = missing_shards(parts)
    if shards:
        held = [f"{s.shard} ({str(s.folder)!r})" for s in sources if s.shard]
        plural = "s" if len(held) > 1 else ""
        return (
            f"shard {', '.join(shards)} of the plan is missing: the folders hold "
            f"shard{plural} {', '.join(held)} only"
        )
    for s in sources:
        unrecorded = s.log.unrecorded()
        if unrecorded:
            device, _, case, mode = unrecorded[0]
            more = f" and {len(unrecorded) - 1} more" if len(unrecorded) > 1 else ""
            return (
                f"{len(unrecorded)} case(s) that {str(s.folder)!r} planned have no record "
                f"({case} on {device}, mode {mode}{more}): its run is incomplete, run it "
                "again into a new folder"
            )
    return None


def _name_devices(sources: list[Source]) -> None:
    """Each device's name in the merged run: its own, or ``host/label`` where two hosts
    name a device alike."""
    hosts: dict[str, set[str]] = {}
    for s in sources:
        for label in _labels(s):
            hosts.setdefault(label, set()).add(s.host)
    clash = any(len(h) > 1 for h in hosts.values())
    for s in sources:
        s.names = {label: f"{s.host}/{label}" if clash else label for label in _labels(s)}


def _labels(s: Source) -> set[str]:
    return (
        {d.device for d in s.header.devices}
        | {r.device for log in (s.log, s.rerun) for r in log.cases}
        | {p.device for p in s.log.plans}
    )


def _refuse_duplicates(sources: list[Source]) -> None:
    where: dict[tuple[str, str, str, str], Path] = {}
    for s in sources:
        for r in s.log.cases:
            if r.harness_made:
                continue
            key = (s.names[r.device], r.suite, r.case, r.mode)
            if key in where:
                device, suite, case, mode = key
                raise UsageProblem(
                    f"cannot merge: case {case} of suite {suite} ({mode}) on {device} is in "
                    f"both {str(where[key])!r} and {str(s.folder)!r}; a merged run holds each "
                    "case of a device once (merge the shards of one plan, or runs of "
                    "different machines)"
                )
            where[key] = s.folder


def _renamed(r: CaseRecord, run_id: str, names: dict[str, str]) -> CaseRecord:
    device = names.get(r.device, r.device)
    findings = [
        replace(f, device=names.get(f.device, f.device)) if f.device else f for f in r.findings
    ]
    return replace(r, run_id=run_id, device=device, findings=findings)


def _header(sources: list[Source], run_id: str, out: Path) -> dict[str, Any]:
    first = sources[0].header
    devices: dict[str, dict[str, Any]] = {}
    for s in sources:
        for d in s.header.devices:
            name = s.names.get(d.device, d.device)
            devices.setdefault(
                name,
                {"device": name, "uuid": d.uuid, "name": d.name, "memory_total": d.memory_total},
            )
    modes = list(dict.fromkeys(m for s in sources for m in s.header.modes))
    notes = list(dict.fromkeys(n for s in sources for n in s.header.notes))
    notes.append(
        f"merged from {len(sources)} run folder(s): "
        + ", ".join(str(s.folder) for s in sources)
        + " (their worker logs stay there)"
    )
    hosts = list(dict.fromkeys(s.host for s in sources))
    config = replace(
        first.config,
        shard=None,
        durations=None,
        merged_from=[str(s.folder.resolve()) for s in sources],
    )
    return {
        **first.raw,
        "schema": results.SCHEMA_ID,
        "record": "run",
        "run_id": run_id,
        "started_at": clock.now(),  # the merge's: its parts' are in "parts"
        "gpucheck_version": gpucheck.__version__,
        "host": ", ".join(hosts),
        "devices": list(devices.values()),
        "suites": sorted({x for s in sources for x in s.header.suites}),
        "modes": modes,
        "notes": notes,
        "not_runnable": {k: v for s in sources for k, v in s.header.not_runnable.items()},
        "command": ["gpucheck", "merge", *(str(s.folder) for s in sources), "--out", str(out)],
        "config": config.to_json(),
        "parts": [s.part().to_json() for s in sources],
    }


def _copy_lines(sources: list[Source], name: str, out: Path) -> None:
    """The lines of file ``name`` of every folder (records of other producers) after each
    other in ``out/name``; a torn last line is left out."""
    chunks = []
    for s in sources:
        f = open_regular(s.folder / name)
        if f is None:
            continue
        with f:
            data = f.read()
        chunks.append(data[: data.rfind(b"\n") + 1])
    if any(chunks):
        (out / name).write_bytes(b"".join(chunks))


def _refuse_twice(folders: list[Path]) -> None:
    seen: dict[Path, Path] = {}
    for f in folders:
        same = seen.setdefault(f.resolve(), f)
        if same is not f:
            also = "" if str(same) == str(f) else f" (as {str(same)!r} and {str(f)!r})"
            raise UsageProblem(
                f"cannot merge: the run folder {str(f)!r} is named twice{also}; name each once"
            )


def merge(
    folders: list[Path],
    out: Path | None,
    formats: tuple[str, ...] = (),
    allow_incomplete: bool = False,
) -> int:
    """Merge the runs in ``folders`` into a new run folder ``out`` (default a new
    ``reports/<timestamp>/``) and write its reports; returns the merged run's exit code.
    ``allow_incomplete``: merge what is there when a shard or a planned case is missing (the
    merged run's verdict is then ``incomplete``).

    Raises:
        UsageProblem: a folder is not a finished run, the folders differ in a setting, a
            case is in two of them, or (without ``allow_incomplete``) a shard or a planned
            case is missing (one sentence each, before anything is written).
    """
    _refuse_twice(folders)
    sources = [_read(f) for f in folders]
    _refuse_differences(sources)
    missing = _missing(sources)
    if missing is not None and not allow_incomplete:
        raise UsageProblem(
            f"cannot merge: {missing}; merge every shard's finished folder, or pass "
            "--allow-incomplete for a merged report whose verdict is incomplete (exit 2)"
        )
    _name_devices(sources)
    _refuse_duplicates(sources)
    target = prepare_out(out, "merge")
    run_id = uuid.uuid4().hex[:12]
    folder = RunFolder(target)
    results.append(folder.results, _header(sources, run_id, target))
    for s in sources:
        for plan in s.log.plans:
            device = s.names.get(plan.device, plan.device)
            results.append(folder.results, replace(plan, run_id=run_id, device=device).to_json())
        for r in s.log.cases:
            results.append(folder.results, _renamed(r, run_id, s.names).to_json())
        for r in s.rerun.cases:
            results.append(folder.rerun, _renamed(r, run_id, s.names).to_json())
    for name in (TIMELINE, *EXTRAS):
        _copy_lines(sources, name, target)
    cfg = RunConfig(formats=formats, allow_empty=bool(sources[0].setting("allow_empty")))
    notes = [f"merged {len(sources)} run folder(s) at {datetime.now():%Y-%m-%d %H:%M:%S}"]
    if missing is not None:
        notes.append(f"--allow-incomplete: {missing}")
    return pipeline.Run.in_folder(cfg, target, run_id, notes).finish(None)
