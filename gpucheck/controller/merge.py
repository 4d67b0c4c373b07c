"""``gpucheck merge DIR... [--out DIR]``: one run folder, and its reports, from the run
folders of several jobs (the shards of a CI matrix or a Slurm array, or the same suites on
several machines).

The folders must be runs of one gpucheck with one set of settings (:data:`SETTINGS`: the
modes, the suites, the detectors, the pytest arguments...), each finished (an interrupted one
is resumed first), and no case may be in two of them on the same device: each refusal is one
sentence naming the difference and the folders. Where the folders come from different hosts
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
from gpucheck.model import results
from gpucheck.model.layout import EXTRAS, RESULTS, TIMELINE, RunFolder, open_regular
from gpucheck.model.results import CaseRecord
from gpucheck.model.runlog import RunHeader, RunLog

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
#: the key of a merged run's ``config`` that lists the folders it was made from
MERGED_FROM = "merged_from"


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

    def setting(self, name: str) -> Any:
        """A setting of :data:`SETTINGS`, the shard count, the version or the detectors."""
        if name == "gpucheck version":
            return self.header.field("gpucheck_version")
        if name == "detectors":
            return self.header.raw.get("detectors")
        if name == "shard count":
            shard = self.header.config.get("shard")
            return shard.partition("/")[2] if isinstance(shard, str) else None
        return self.header.config.get(name)


def _read(folder: Path) -> Source:
    path = RunFolder(folder).results
    log = RunLog.read(path)
    if log.header is None:
        raise UsageProblem(f"cannot merge {str(folder)!r}: it holds no gpucheck run ({RESULTS})")
    end = log.end
    if end is None or end.interrupted:
        how = "was interrupted" if end is not None else "has not finished (or its controller died)"
        raise UsageProblem(
            f"cannot merge {str(folder)!r}: its run {how}; `gpucheck run --resume {folder}` "
            "finishes it, then merge"
        )
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
        shard = s.header.config.get("shard")
        if isinstance(shard, str):
            if shard in seen:
                raise UsageProblem(
                    f"cannot merge: shard {shard} is in both {str(seen[shard])!r} and "
                    f"{str(s.folder)!r} (each shard once)"
                )
            seen[shard] = s.folder


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
    return {d.device for d in s.header.devices} | {
        r.device for log in (s.log, s.rerun) for r in log.cases
    }


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
    started = sorted(s.header.started_at for s in sources if s.header.started_at)
    config = {
        **first.config,
        "shard": None,
        "durations": None,
        MERGED_FROM: [str(s.folder.resolve()) for s in sources],
    }
    return {
        **first.raw,
        "schema": results.SCHEMA_ID,
        "record": "run",
        "run_id": run_id,
        "started_at": started[0] if started else first.started_at,
        "gpucheck_version": gpucheck.__version__,
        "host": ", ".join(hosts),
        "devices": list(devices.values()),
        "suites": sorted({x for s in sources for x in s.header.suites}),
        "modes": modes,
        "notes": notes,
        "not_runnable": {k: v for s in sources for k, v in s.header.not_runnable.items()},
        "command": ["gpucheck", "merge", *(str(s.folder) for s in sources), "--out", str(out)],
        "config": config,
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


def merge(folders: list[Path], out: Path | None, formats: tuple[str, ...] = ()) -> int:
    """Merge the runs in ``folders`` into a new run folder ``out`` (default a new
    ``reports/<timestamp>/``) and write its reports; returns the merged run's exit code.

    Raises:
        UsageProblem: a folder is not a finished run, the folders differ in a setting, or a
            case is in two of them (one sentence each, before anything is written).
    """
    unique = list(dict.fromkeys(f.resolve() for f in folders))
    if len(unique) < len(folders):
        raise UsageProblem("cannot merge: a run folder is named twice")
    sources = [_read(f) for f in folders]
    _refuse_differences(sources)
    _name_devices(sources)
    _refuse_duplicates(sources)
    target = prepare_out(out)
    run_id = uuid.uuid4().hex[:12]
    folder = RunFolder(target)
    results.append(folder.results, _header(sources, run_id, target))
    for s in sources:
        for r in s.log.cases:
            results.append(folder.results, _renamed(r, run_id, s.names).to_json())
        for r in s.rerun.cases:
            results.append(folder.rerun, _renamed(r, run_id, s.names).to_json())
    for name in (TIMELINE, *EXTRAS):
        _copy_lines(sources, name, target)
    cfg = RunConfig(formats=formats, allow_empty=bool(sources[0].setting("allow_empty")))
    notes = [f"merged {len(sources)} run folder(s) at {datetime.now():%Y-%m-%d %H:%M:%S}"]
    return pipeline.Run.in_folder(cfg, target, run_id, notes).finish(None)
