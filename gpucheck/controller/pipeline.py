"""``gpucheck run`` in one process: the passes of a run over its target devices, the
wrong-device check's re-runs, the run-level diagnoses, the reports and the exit code.

The distributed controller (:mod:`~gpucheck.controller.dist_pipeline`) builds on the public
functions here (:func:`sigterm_as_interrupt`, :func:`finish`); :mod:`~gpucheck.controller.entry`
chooses between them.
"""

from __future__ import annotations

import contextlib
import signal
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from gpucheck.controller import devlock, reruns, sharding
from gpucheck.controller import suites as suites_mod
from gpucheck.controller.config import (
    DEFAULT_MODES,
    DIST_MODE,
    RunConfig,
    Target,
    check_same_devices,
    choose_targets,
    header,
    make_console,
    plan_passes,
    prepare_out,
    select_runnable,
)
from gpucheck.controller.harness import Harness, WorkerSpec
from gpucheck.controller.progress import (
    Progress,
    print_findings,
    print_verdict,
    summary_line,
    summary_table,
)
from gpucheck.detectors import registry
from gpucheck.detectors.wrong_device import suspects
from gpucheck.errors import GpucheckError, OutputProblem
from gpucheck.model import modes, results
from gpucheck.model.contract import CURRENT_ENV, OTHER_CURRENT, TARGET_CURRENT
from gpucheck.model.layout import RunFolder
from gpucheck.model.modes import Mode, tool_of
from gpucheck.model.runlog import Diagnosis, Resume, RunEnd, RunHeader, RunLog
from gpucheck.nvml_sampler import Sampler, TimelineWriter
from gpucheck.report import Published, publish
from gpucheck.sanitizer import command as sanitizer_cmd

#: a pass a run adds after its own (the distributed suite as a CPU group, in the default run
#: without a GPU): (cfg, run folder, results file, run id, notes) -> True when interrupted
ExtraPass = Callable[[RunConfig, Path, Path, str, list[str]], bool]


def run(
    cfg: RunConfig, previous: RunHeader | None = None, cpu_dist_pass: ExtraPass | None = None
) -> int:
    """Run the suites on every target device; returns the exit code of the whole run.
    ``previous``: the header of the run ``cfg.resume`` continues. ``cpu_dist_pass``: runs the
    distributed suite in the default ``--cpu-only`` run (given by the entry point, which
    knows the distributed controller; this module does not)."""
    asked = tuple(dict.fromkeys(cfg.modes)) or DEFAULT_MODES
    sanitizer = None
    if any(tool_of(m) for m in asked):
        sanitizer = sanitizer_cmd.find()
    targets, notes, _, inv = choose_targets(cfg)
    if previous is not None:
        check_same_devices(previous, targets)
    with devlock.held(targets, cfg.resume, cfg.wait_for_devices, notes) as lock:
        run_modes = asked
        if cfg.cpu_only and "nvml" in asked:
            run_modes = tuple(m for m in asked if m != "nvml")
            notes.append("--cpu-only: mode 'nvml' has no GPU to sample")
        passes = plan_passes(run_modes, len(inv.devices) if inv else 0) or [(modes.BARE, None)]
        requested = (
            cfg.suite_paths
            if cfg.suite_paths is not None
            else suites_mod.resolve(cfg.suites, cpu_only=cfg.cpu_only)
        )
        # the default first run without a GPU: the suites that need none, then the distributed
        # suite as a gloo group of CPU ranks (cpu_dist_pass)
        cpu_defaults = cpu_dist_pass is not None and (
            DIST_MODE in previous.modes
            if previous is not None
            else cfg.cpu_only and not cfg.suites and suites_mod.defaults_are_ours()
        )
        if cpu_defaults and (gpu_only := suites_mod.left_out_without_gpu()):
            notes.append(
                f"--cpu-only: the suites {', '.join(gpu_only)} test CUDA kernels and "
                "need a GPU; they were not run (`gpucheck run` on a machine with one)"
            )
        existed = cfg.out is not None and cfg.out.exists()
        out = cfg.resume if cfg.resume is not None else prepare_out(cfg.out)
        lock.note_folder(out)
        try:
            suites, not_runnable = select_runnable(cfg, requested)
        except GpucheckError:
            if cfg.resume is None and not existed:
                with contextlib.suppress(OSError):
                    out.rmdir()  # nothing ran: leave no empty run folder behind
            raise
        sharding.prepare(cfg.shard, cfg.durations, out)
        results_path = RunFolder(out).results
        if previous is None:
            run_id = uuid.uuid4().hex[:12]
            header_passes = passes + ([(DIST_MODE, None)] if cpu_defaults else [])
            results.append(
                results_path,
                header(
                    cfg, run_id, targets, inv, requested, header_passes, notes, not_runnable, asked
                ),
            )
        else:
            run_id = previous.run_id
            results.append(results_path, Resume(run_id, _now(), notes, not_runnable).to_json())
        console = make_console()
        stopped: list[str] = []
        log = RunLog(results_path)  # the controller's one reader of the run's records
        try:
            with sigterm_as_interrupt(stopped):
                interrupted = _run_passes(
                    cfg,
                    passes,
                    targets,
                    suites,
                    sanitizer,
                    out,
                    log,
                    run_id,
                    notes,
                    console,
                    len(inv.devices) if inv else 0,
                )
                if (
                    cpu_defaults
                    and cpu_dist_pass is not None
                    and not interrupted
                    and not _has_mode(log, run_id, DIST_MODE)
                ):
                    interrupted = cpu_dist_pass(cfg, out, results_path, run_id, notes)
        except BaseException as err:  # the harness itself failed: report what was recorded
            with contextlib.suppress(OutputProblem):  # the disk that failed may fail again
                _end_record(results_path, run_id, True, f"the harness stopped: {err!r}")
            with contextlib.suppress(Exception):
                publish(out, formats=cfg.report_formats)
            raise
        return finish(
            cfg,
            out,
            results_path,
            run_id,
            notes,
            not_runnable,
            (stopped[0] if stopped else "Ctrl-C") if interrupted else None,
            console,
        )


def _has_mode(log: RunLog, run_id: str, mode: str) -> bool:
    """Whether the run already recorded cases of ``mode`` (a resumed run skips that pass)."""
    log.refresh()
    return any(r.run_id == run_id and r.mode == mode for r in log.cases)


@contextlib.contextmanager
def sigterm_as_interrupt(stopped: list[str]) -> Iterator[None]:
    """SIGTERM (a CI job cancelled, a scheduler's time limit) stops the run the way Ctrl-C
    does: workers stopped, finished cases kept, reports written, ``--resume`` possible."""

    def handler(signum: int, frame: object) -> None:
        stopped.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_passes(
    cfg: RunConfig,
    passes: list[tuple[str, str | None]],
    targets: list[Target],
    suites: dict[str, Path],
    sanitizer: Path | None,
    out: Path,
    log: RunLog,
    run_id: str,
    notes: list[str],
    console: Console,
    visible: int,
) -> bool:
    """Every pass on every target; True when Ctrl-C stopped it."""
    rerun_log = RunLog(RunFolder(out).rerun)
    with Progress(console, quiet=cfg.quiet) as progress:
        for label, tool in passes:
            mode = Mode.parse(label)
            interval = cfg.nvml_interval if mode.nvml else 0.0
            current = TARGET_CURRENT if mode.target_current else OTHER_CURRENT
            specs = [
                WorkerSpec(
                    t_label,
                    index,
                    u,
                    suites,
                    label,
                    _pass_env(label, cfg, current),
                    [*cfg.pytest_args, *sharding.worker_args(out)],
                    interval,
                    tool,
                    sanitizer,
                )
                for t_label, index, u, _ in targets
            ]
            if _run_harness(specs, out, log, run_id, cfg.timeout, progress, notes, interval):
                return True
            if (
                visible > 1
                and tool is None
                and current == OTHER_CURRENT
                and _rerun_suspects(cfg, label, specs, out, log, rerun_log, run_id, progress, notes)
            ):
                return True
    return False


def _pass_env(label: str, cfg: RunConfig, current: str) -> dict[str, str]:
    env = {CURRENT_ENV: current}
    if Mode.parse(label).blocking:
        env["CUDA_LAUNCH_BLOCKING"] = "1"
    if cfg.cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _run_harness(
    specs: list[WorkerSpec],
    out: Path,
    log: RunLog,
    run_id: str,
    timeout: float,
    progress: Progress,
    notes: list[str],
    interval: float,
) -> bool:
    """One pass of workers (with the NVML timeline when asked); True after Ctrl-C."""
    progress.follow(log)
    harness = Harness(specs, out, log, run_id, timeout, on_update=progress.update)
    timeline = TimelineWriter(RunFolder(out).timeline) if interval > 0 else None
    sampler = Sampler(interval, timeline).start() if timeline is not None else None
    try:
        return run_until_interrupted(harness)
    finally:
        if sampler is not None and timeline is not None:
            sampler.stop()
            timeline.close()
            notes.append(
                f"nvml: {sampler.samples} samples of {len(sampler.devices)} "
                f"device(s) every {interval * 1000:g} ms in {timeline.path.name}"
            )
            if sampler.first_failure is not None:
                when, why = sampler.first_failure
                notes.append(
                    f"nvml: NVML failed in {sampler.failures} of {sampler.samples} "
                    f"samples, first at {datetime.fromtimestamp(when):%H:%M:%S} "
                    f"({why}): the timeline has no memory where it failed, and the "
                    "cases that ran then have no NVML peak (a warning each)"
                )


def run_until_interrupted(harness: Any) -> bool:
    """Run a harness (or a distributed one) to its end; True when Ctrl-C or SIGTERM stopped
    it, after its workers were stopped (finished records are kept)."""
    try:
        harness.run()
    except KeyboardInterrupt:
        harness.interrupt()
        return True
    except OutputProblem:  # no record can be written: stop every worker, say it in one line
        harness.interrupt()
        raise
    return False


def _rerun_suspects(
    cfg: RunConfig,
    label: str,
    specs: list[WorkerSpec],
    out: Path,
    log: RunLog,
    rerun_log: RunLog,
    run_id: str,
    progress: Progress,
    notes: list[str],
) -> bool:
    """The wrong-device check: cases of this pass that went wrong with another device current
    run again with their target current, in fresh workers, records to rerun.jsonl."""
    log.refresh()
    bad = suspects([r for r in log.cases if r.run_id == run_id], label)
    folder = RunFolder(out)
    rerun, control = (
        str(Mode.parse(label).with_variant(v)) for v in (modes.RERUN_TARGET, modes.RERUN_CONTROL)
    )
    reruns, controls = [], []
    for spec in specs:
        mine = sorted({r.case for r in bad if r.device == spec.label})
        if not mine:
            continue
        only = folder.worker(spec.label, rerun).only
        only.parent.mkdir(parents=True, exist_ok=True)
        only.write_text("\n".join(mine) + "\n")
        args = [*spec.pytest_args, "--gpucheck-only", str(only)]
        reruns.append(
            WorkerSpec(
                spec.label,
                spec.device_index,
                spec.uuid,
                spec.suites,
                rerun,
                _pass_env(label, cfg, TARGET_CURRENT),
                args,
            )
        )
        # the control: the same arrangement as the first time, in a fresh worker; a failure
        # that does not come back (a random input, a race) is no evidence of a device bug
        controls.append(
            WorkerSpec(
                spec.label,
                spec.device_index,
                spec.uuid,
                spec.suites,
                control,
                _pass_env(label, cfg, OTHER_CURRENT),
                args,
            )
        )
    if not reruns:
        return False
    notes.append(
        f"wrong-device check: {len(bad)} case(s) that went wrong with another device "
        f"current ran again, with their target current and (control) with the other "
        f"device current again ({folder.rerun.name})"
    )
    for specs_ in (reruns, controls):
        if _run_harness(specs_, out, rerun_log, run_id, cfg.timeout, progress, notes, 0.0):
            return True
    return False


def _diagnose(out: Path, results_path: Path, run_id: str) -> list[Diagnosis]:
    """Run-level detectors over every record, and what the wrong-device re-runs found
    besides their outcome (:func:`~gpucheck.controller.reruns.carried`): their findings
    become diagnosis records of the cases they are about."""
    log = RunLog.read(results_path)
    records = [r for r in log.cases if r.run_id == run_id]
    records += [r for r in RunLog.read(RunFolder(out).rerun).cases if r.run_id == run_id]
    head = next((h for h in log.headers if h.run_id == run_id), None)
    found = [
        f
        for detector in registry.run_detectors(registry.RunContext.of_header(head))
        for f in detector.run_finished(records)
    ]
    made = []
    for finding in [*found, *reruns.carried(records)]:
        mine = [
            r
            for r in records
            if (r.device, r.suite, r.case) == (finding.device, finding.suite, finding.case)
        ]
        if not mine:  # a detector's finding about no case of the run: nowhere to attach
            continue
        original = next((r for r in mine if not Mode.parse(r.mode).variant), mine[0])
        diagnosis = Diagnosis(
            run_id, original.device, original.suite, original.case, original.mode, [finding]
        )
        results.append(results_path, diagnosis.to_json())
        made.append(diagnosis)
    return made


def _end_record(
    results_path: Path,
    run_id: str,
    interrupted: bool,
    reason: str | None,
    stopped_by: str | None = None,
) -> None:
    results.append(results_path, RunEnd(run_id, _now(), interrupted, reason, stopped_by).to_json())


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


def finish(
    cfg: RunConfig,
    out: Path,
    results_path: Path,
    run_id: str,
    notes: list[str],
    not_runnable: dict[str, str],
    stopped_by: str | None,
    console: Console,
) -> int:
    """End record, run-level diagnoses, reports, the summary, and the exit code: the run's
    verdict (gpucheck.report.verdict) decides it, as it decides every report's."""
    stopped = (
        (
            f"stopped by {stopped_by}: finished cases were kept; `gpucheck run --resume "
            f"{out}` runs the rest"
        )
        if stopped_by is not None
        else None
    )
    _end_record(results_path, run_id, stopped is not None, stopped, stopped_by)
    _diagnose(out, results_path, run_id)
    done = publish(
        out, formats=cfg.report_formats, allow_empty=cfg.allow_empty, stopped_by=stopped_by
    )
    summarize(console, done, notes, not_runnable, results_path, stopped)
    return done.verdict.exit_code


def summarize(
    console: Console,
    done: Published,
    notes: list[str],
    not_runnable: dict[str, str],
    results_path: Path,
    stopped: str | None,
) -> None:
    """The end of a run on the console: counts per device and suite, notes, the findings
    (diagnoses first), the files written, why the verdict is not a pass, and last the
    verdict with the case counts."""
    records = done.data.cases
    console.print(summary_table(records))
    for note in notes:
        console.print(Text.assemble(("note:", "yellow"), f" {note}"))
    print_findings(console, done.grouped)
    for name, reason in not_runnable.items():
        console.print(Text.assemble((f"suite {name}:", "red"), f" {reason}"))
    written = "  ".join(f"{fmt}: {path}" for fmt, path in done.paths.items())
    console.print(Text(f"results: {results_path}  {written}"))
    if stopped is not None and stopped not in done.verdict.why:
        console.print(Text.assemble(("interrupted:", "yellow"), f" {stopped}"))
    print_verdict(console, done.verdict)
    line, _ = summary_line(records)
    style = "green" if done.verdict.ok else "red"
    console.print(
        Text.assemble((f"{done.verdict.name} (exit {done.verdict.exit_code})", style), f": {line}")
    )
