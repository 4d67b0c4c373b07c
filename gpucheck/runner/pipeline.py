"""``gpucheck run``: from a RunConfig to results.jsonl, junit.xml and an exit code."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

import gpucheck
from gpucheck import devices as devices_mod
from gpucheck.detectors.imbalance import Imbalance
from gpucheck.detectors.numerics import Numerics
from gpucheck.detectors.oom_anomaly import OomAnomaly
from gpucheck.detectors.stray_context import StrayContext
from gpucheck.detectors.wrong_device import (
    CONTROL_SUFFIX,
    RERUN_SUFFIX,
    TARGET_SUFFIX,
    WrongDevice,
    suspects,
)
from gpucheck.errors import EnvironmentProblem, GpucheckError, UsageProblem
from gpucheck.pytest_plugin import CURRENT_ENV
from gpucheck.report import DEFAULT_FORMATS, Published, publish, results
from gpucheck.runner import suites as suites_mod
from gpucheck.runner.harness import Harness, WorkerSpec
from gpucheck.runner.nvml_sampler import DEFAULT_INTERVAL_S, Sampler, TimelineWriter
from gpucheck.runner.progress import (
    Progress,
    print_findings,
    print_verdict,
    summary_line,
    summary_table,
)
from gpucheck.sanitizer import command as sanitizer_cmd

DEFAULT_MODES = ("blocking", "nvml")
#: the mode label of a distributed pass (records of gpucheck.runner.dist_pipeline)
DIST_MODE = "dist"


@dataclass
class RunConfig:
    all_devices: bool = False
    devices: tuple[int, ...] = ()
    suites: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    out: Path | None = None
    timeout: float = 900.0
    quiet: bool = False
    cpu_only: bool = False
    pytest_args: list[str] = field(default_factory=list)
    nvml_interval: float = DEFAULT_INTERVAL_S
    allow_empty: bool = False
    resume: Path | None = None
    suite_paths: dict[str, Path] | None = None  # resolved suites (set when resuming)
    distributed: bool = False  # one rank per device through torch.distributed
    world_size: int | None = None  # ranks of a --distributed --cpu-only run (default 2)
    backend: str | None = None  # torch.distributed backend (default nccl on GPUs, else gloo)
    formats: tuple[str, ...] = ()  # reports to write (default: report.DEFAULT_FORMATS)
    #: the options the user gave on the command line (``--nvml-interval``, ...): a default
    #: cannot be told apart from the same value given, and a given option must apply
    given: frozenset[str] = frozenset()

    @property
    def report_formats(self) -> tuple[str, ...]:
        return self.formats or DEFAULT_FORMATS


def _unwritable(path: Path, err: OSError) -> UsageProblem:
    return UsageProblem(f"cannot write to the output folder {str(path)!r}: "
                        f"{err.strerror or err}")


def _new_default_out(base: Path) -> Path:
    """reports/<timestamp>/, made atomically: a run started in the same second gets -2, -3..."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        path = base / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as err:
            raise _unwritable(path, err) from err
        return path
    raise UsageProblem(f"cannot find a free output folder for {stamp} under {str(base)!r}")


def prepare_out(out: Path | None) -> Path:
    """A fresh output folder for a new run (default reports/<timestamp>/), proven writable.

    A run never writes into a folder that holds anything already: results of two runs in one
    results.jsonl would be counted together. ``--resume DIR`` is the way to continue a run.
    """
    if out is None:
        path = _new_default_out(Path("reports"))
    else:
        path = out
        try:
            path.mkdir(parents=True, exist_ok=True)
            used = any(path.iterdir())
        except OSError as err:
            raise _unwritable(path, err) from err
        if used:
            held = ("a gpucheck run" if (path / "results.jsonl").exists() else "other files")
            raise UsageProblem(
                f"the output folder {str(path)!r} already holds {held}; a new run needs an "
                f"empty folder (omit --out for a new reports/<timestamp>/), and "
                f"`gpucheck run --resume {path}` continues an interrupted run")
    try:
        probe = path / ".gpucheck-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise _unwritable(path, err) from err
    return path


def load_resume(folder: Path, cfg: RunConfig) -> tuple[RunConfig, dict[str, Any]]:
    """The config and header of the run in ``folder``, for ``--resume``."""
    given = [flag for flag, value in (
        ("--all-devices", cfg.all_devices), ("--device", cfg.devices), ("--suite", cfg.suites),
        ("--mode", cfg.modes), ("--out", cfg.out), ("--cpu-only", cfg.cpu_only),
        ("--allow-empty", cfg.allow_empty), ("pytest arguments", cfg.pytest_args),
        ("--timeout", "timeout" in cfg.given), ("--nvml-interval", "nvml_interval" in cfg.given),
        ("--distributed", cfg.distributed), ("--world-size", cfg.world_size is not None),
        ("--backend", cfg.backend is not None)) if value]
    if given:
        raise UsageProblem(f"--resume continues a run with the settings it was started with; "
                           f"drop {', '.join(given)}")
    path = folder / "results.jsonl"
    header = next((r for r in results.read(path) if r.get("record") == "run"), None) \
        if path.is_file() else None
    if header is None:
        raise UsageProblem(f"{str(folder)!r} holds no gpucheck run to resume "
                           "(no results.jsonl with a run header)")
    saved = header.get("config")
    if not isinstance(saved, dict):
        raise UsageProblem(f"the run in {str(folder)!r} was written by a gpucheck that did not "
                           "record its settings; it cannot be resumed")
    resumed = RunConfig(
        all_devices=bool(saved.get("all_devices")), devices=tuple(saved.get("devices") or ()),
        suites=tuple(saved.get("suites") or ()), modes=tuple(saved.get("modes") or ()),
        out=folder, timeout=float(saved.get("timeout", cfg.timeout)), quiet=cfg.quiet,
        cpu_only=bool(saved.get("cpu_only")), pytest_args=list(saved.get("pytest_args") or []),
        nvml_interval=float(saved.get("nvml_interval", cfg.nvml_interval)),
        allow_empty=bool(saved.get("allow_empty")), resume=folder,
        distributed=bool(saved.get("distributed")), world_size=saved.get("world_size"),
        backend=saved.get("backend"), formats=cfg.formats,
        suite_paths={n: Path(p) for n, p in dict(saved.get("suite_paths") or {}).items()})
    return resumed, header


def extension_problem() -> str | None:
    """Why gpucheck's compiled kernels cannot be loaded, or None when they can.

    Checked in a child process (the parent never imports torch, and a broken build must not
    take the harness down with it). Where the kernels were not built at install, the child
    builds them first, once, with one progress line (gpucheck.ops._ext).
    """
    from gpucheck.ops import _ext

    return _ext.problem_in_child()


Target = tuple[str, int | None, str | None, str | None]  # label, CUDA index, UUID, name


def choose_targets(cfg: RunConfig
                   ) -> tuple[list[Target], list[str], str | None, devices_mod.Inventory | None]:
    """Each target, notes for the run header, the driver version, and the inventory of the
    visible devices (the targets are some of them; None with --cpu-only)."""
    if cfg.cpu_only:
        return ([("cpu", None, None, None)],
                ["--cpu-only: GPUs hidden; cases that need one are skipped"], None, None)
    inv = devices_mod.discover()
    if inv.environment_error:
        raise EnvironmentProblem(inv.environment_error)
    if not inv.devices:
        raise EnvironmentProblem(f"{inv.reason} Use --cpu-only to run without a GPU.")
    visible = [d.cuda_index for d in inv.devices]
    wanted = list(dict.fromkeys(cfg.devices)) if cfg.devices else visible
    for index in wanted:
        if index not in visible:
            raise UsageProblem(f"--device {index} is out of range: {len(visible)} CUDA device(s) "
                               f"visible ({', '.join(map(str, visible))})")
    notes = []
    if len(visible) < 2:
        notes.append("only one CUDA device is visible: wrong-device checks (another device "
                      "current while the target runs) could not run")
    chosen = [d for d in inv.devices if d.cuda_index in wanted]
    return ([(f"cuda:{d.cuda_index}", d.cuda_index, d.uuid, d.name) for d in chosen], notes,
            inv.driver_version, inv)


#: the arrangements a case can run in: another device current (how training leaves it), or
#: its own target current with no other device touched
OTHER_CURRENT, TARGET_CURRENT = "other", "target"
#: where the re-runs of the wrong-device check write their case records
RERUN_FILE = "rerun.jsonl"


def plan_passes(modes: tuple[str, ...], devices: int = 1) -> list[tuple[str, str | None]]:
    """(mode label, sanitizer tool) of each pass: blocking/nvml share one worker per device;
    every sanitizer tool needs its own, and with two or more devices it runs twice: with
    another device current, and with the target current (``|target-current``), because a
    wrong-device fault ends the process before memcheck sees a second bug in the kernel."""
    passes: list[tuple[str, str | None]] = []
    plain = [m for m in ("blocking", "nvml") if m in modes]
    if plain:
        passes.append(("+".join(plain), None))
    for m in modes:
        if m.startswith("sanitizer"):
            tool = sanitizer_cmd.tool_of(m)
            for label in (f"sanitizer:{tool}",
                          *((f"sanitizer:{tool}{TARGET_SUFFIX}",) if devices > 1 else ())):
                if (label, tool) not in passes:
                    passes.append((label, tool))
    return passes


def _check_same_devices(header: dict[str, Any], targets: list[Target]) -> None:
    """A resumed run must target the same GPUs (by UUID) as the run it continues."""
    before = {d.get("device"): d.get("uuid") for d in header.get("devices", [])}
    for label, _, uuid_now, _ in targets:
        if before.get(label) and uuid_now and before[label] != uuid_now:
            raise UsageProblem(f"cannot resume: {label} is now {uuid_now}, but the run was "
                               f"started on {before[label]}")


def _select_runnable(cfg: RunConfig, suites: dict[str, Path]
                     ) -> tuple[dict[str, Path], dict[str, str]]:
    """The suites that can run, and the reason of each that cannot (gpucheck's own kernels
    are not built). Raises when none can: one sentence with the fix, before any worker."""
    if cfg.cpu_only:  # their cases need a GPU and are skipped anyway
        return suites, {}
    needing = [n for n, p in suites.items() if suites_mod.needs_kernels(p)]
    problem = extension_problem() if needing else None
    if problem is None:
        return suites, {}
    names = ", ".join(needing)
    if len(needing) == len(suites):
        raise EnvironmentProblem(f"{problem.rstrip('.')}. Nothing was run: the suite(s) "
                                 f"{names} test gpucheck's own kernels.")
    reason = f"not runnable: {problem}"
    return {n: p for n, p in suites.items() if n not in needing}, {n: reason for n in needing}


def _header(cfg: RunConfig, run_id: str, targets: list[Target], inv: devices_mod.Inventory | None,
            suites: dict[str, Path], passes: list[tuple[str, str | None]], notes: list[str],
            not_runnable: dict[str, str], modes: tuple[str, ...]) -> dict[str, Any]:
    config = {
        # as asked (the targets themselves are under "devices" of the header)
        "all_devices": cfg.all_devices, "devices": list(cfg.devices),
        "suites": list(cfg.suites), "suite_paths": {n: str(p) for n, p in suites.items()},
        "modes": list(modes), "timeout": cfg.timeout, "cpu_only": cfg.cpu_only,
        "pytest_args": list(cfg.pytest_args), "nvml_interval": cfg.nvml_interval,
        "allow_empty": cfg.allow_empty, "distributed": cfg.distributed,
        "world_size": cfg.world_size, "backend": cfg.backend,
    }
    memory = {d.uuid: d.memory_total for d in inv.devices} if inv else {}
    return {
        "schema": results.SCHEMA_ID, "record": "run", "run_id": run_id,
        "started_at": datetime.now().astimezone().isoformat(timespec="milliseconds"),
        "gpucheck_version": gpucheck.__version__,
        "torch_version": devices_mod.torch_version(),
        "driver_version": inv.driver_version if inv else None,
        "cuda_driver_version": inv.cuda_driver_version if inv else None,
        "host": socket.gethostname(),
        "devices": [{"device": label, "uuid": u, "name": name,
                     "memory_total": memory.get(u or "")} for label, _, u, name in targets],
        "suites": sorted(suites), "modes": [label for label, _ in passes], "notes": notes,
        "not_runnable": not_runnable,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "command": ["gpucheck", *sys.argv[1:]], "config": config,
    }


def refuse_inapplicable(cfg: RunConfig) -> None:
    """An option that cannot apply to the run asked for is an error, not silently ignored:
    one sentence naming the option to drop."""
    if cfg.all_devices and cfg.devices:
        raise UsageProblem("--all-devices and --device exclude each other")
    sanitizer = any(m.startswith("sanitizer") for m in cfg.modes)
    if cfg.cpu_only:
        for flag, given in (("--device", bool(cfg.devices)), ("--all-devices", cfg.all_devices)):
            if given:
                raise UsageProblem(f"{flag} picks GPUs, and --cpu-only runs without any: drop "
                                   f"one of them")
        if sanitizer:
            raise UsageProblem("the sanitizer modes need a GPU; drop --cpu-only")
        if "nvml" in cfg.modes:
            raise UsageProblem("mode nvml samples GPU memory, and --cpu-only has no GPU: drop "
                               "--mode nvml")
    if cfg.distributed and cfg.modes:
        raise UsageProblem("--distributed does not combine with the sanitizer modes"
                           if sanitizer else "--distributed runs its ranks in its own mode "
                           "(dist): drop --mode")
    if not cfg.distributed and (cfg.world_size is not None or cfg.backend is not None):
        raise UsageProblem("--world-size and --backend go with --distributed")
    if "nvml_interval" in cfg.given:
        modes = cfg.modes or DEFAULT_MODES
        why = ("--cpu-only has no GPU to sample" if cfg.cpu_only else
               "--distributed does not sample NVML" if cfg.distributed else
               "mode nvml is not among the --mode given" if "nvml" not in modes else None)
        if why:
            raise UsageProblem(f"--nvml-interval sets the sampling of mode nvml, and {why}: "
                               "drop --nvml-interval")


def run(cfg: RunConfig) -> int:
    """Run the suites on every target device; returns the exit code of the whole run."""
    refuse_inapplicable(cfg)
    previous: dict[str, Any] | None = None
    if cfg.resume is not None:
        cfg, previous = load_resume(cfg.resume, cfg)
    modes = tuple(dict.fromkeys(cfg.modes)) or DEFAULT_MODES
    if cfg.distributed:
        from gpucheck.runner import dist_pipeline

        return dist_pipeline.run(cfg, previous)
    sanitizer = None
    if any(m.startswith("sanitizer") for m in modes):
        sanitizer = sanitizer_cmd.find()
    targets, notes, _, inv = choose_targets(cfg)
    if previous is not None:
        _check_same_devices(previous, targets)
    run_modes = modes
    if cfg.cpu_only and "nvml" in modes:
        run_modes = tuple(m for m in modes if m != "nvml")
        notes.append("--cpu-only: mode 'nvml' has no GPU to sample")
    passes = plan_passes(run_modes, len(inv.devices) if inv else 0) or [("plain", None)]
    requested = (cfg.suite_paths if cfg.suite_paths is not None
                 else suites_mod.resolve(cfg.suites, cpu_only=cfg.cpu_only))
    # the default first run without a GPU: the suites that need none, then the distributed
    # suite as a gloo group of CPU ranks (gpucheck.runner.dist_pipeline.cpu_pass)
    cpu_defaults = (DIST_MODE in previous.get("modes", []) if previous is not None else
                    cfg.cpu_only and not cfg.suites and suites_mod.defaults_are_ours())
    if cpu_defaults and (gpu_only := suites_mod.left_out_without_gpu()):
        notes.append(f"--cpu-only: the suites {', '.join(gpu_only)} test CUDA kernels and need "
                     "a GPU; they were not run (`gpucheck run` on a machine with one)")
    existed = cfg.out is not None and cfg.out.exists()
    out = cfg.resume if cfg.resume is not None else prepare_out(cfg.out)
    try:
        suites, not_runnable = _select_runnable(cfg, requested)
    except GpucheckError:
        if cfg.resume is None and not existed:
            with contextlib.suppress(OSError):
                out.rmdir()  # nothing ran: leave no empty run folder behind
        raise
    results_path = out / "results.jsonl"
    if previous is None:
        run_id = uuid.uuid4().hex[:12]
        header_passes = passes + ([(DIST_MODE, None)] if cpu_defaults else [])
        results.append(results_path, _header(cfg, run_id, targets, inv, requested,
                                             header_passes, notes, not_runnable, modes))
    else:
        run_id = str(previous["run_id"])
        results.append(results_path, {
            "schema": results.SCHEMA_ID, "record": "resume", "run_id": run_id,
            "resumed_at": datetime.now().astimezone().isoformat(timespec="milliseconds"),
            "notes": notes, "not_runnable": not_runnable,
        })
    console = make_console()
    stopped: list[str] = []
    try:
        with _sigterm_as_interrupt(stopped):
            interrupted = _run_passes(cfg, passes, targets, suites, sanitizer, out,
                                      results_path, run_id, notes, console,
                                      len(inv.devices) if inv else 0)
            if cpu_defaults and not interrupted and not _has_mode(results_path, run_id,
                                                                  DIST_MODE):
                from gpucheck.runner import dist_pipeline  # lazy: it imports this module

                interrupted = dist_pipeline.cpu_pass(cfg, out, results_path, run_id, notes)
    except BaseException as err:  # the harness itself failed: report what was recorded
        _end_record(results_path, run_id, True, f"the harness stopped: {err!r}")
        with contextlib.suppress(Exception):
            publish(out, formats=cfg.report_formats)
        raise
    return _finish(cfg, out, results_path, run_id, notes, not_runnable,
                   (stopped[0] if stopped else "Ctrl-C") if interrupted else None, console)


def _has_mode(results_path: Path, run_id: str, mode: str) -> bool:
    """Whether the run already recorded cases of ``mode`` (a resumed run skips that pass)."""
    return any(r.get("run_id") == run_id and r.get("mode") == mode
               for r in results.cases(results_path))


@contextlib.contextmanager
def _sigterm_as_interrupt(stopped: list[str]) -> Iterator[None]:
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


def _run_passes(cfg: RunConfig, passes: list[tuple[str, str | None]], targets: list[Target],
                suites: dict[str, Path], sanitizer: Path | None, out: Path, results_path: Path,
                run_id: str, notes: list[str], console: Console, visible: int) -> bool:
    """Every pass on every target; True when Ctrl-C stopped it."""
    with Progress(console, quiet=cfg.quiet) as progress:
        for label, tool in passes:
            interval = cfg.nvml_interval if "nvml" in label.split("+") else 0.0
            current = TARGET_CURRENT if label.endswith(TARGET_SUFFIX) else OTHER_CURRENT
            specs = [WorkerSpec(t_label, index, u, suites, label,
                                _pass_env(label, cfg, current), cfg.pytest_args, interval, tool,
                                sanitizer) for t_label, index, u, _ in targets]
            if _run_harness(specs, out, results_path, run_id, cfg.timeout, progress, notes,
                            interval):
                return True
            if (visible > 1 and tool is None and current == OTHER_CURRENT
                    and _rerun_suspects(cfg, label, specs, out, results_path, run_id, progress,
                                        notes)):
                return True
    return False


def _pass_env(label: str, cfg: RunConfig, current: str) -> dict[str, str]:
    env = {CURRENT_ENV: current}
    if "blocking" in label.split("+"):
        env["CUDA_LAUNCH_BLOCKING"] = "1"
    if cfg.cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _run_harness(specs: list[WorkerSpec], out: Path, results_path: Path, run_id: str,
                 timeout: float, progress: Progress, notes: list[str], interval: float) -> bool:
    """One pass of workers (with the NVML timeline when asked); True after Ctrl-C."""
    progress.follow(results_path)
    harness = Harness(specs, out, results_path, run_id, timeout, on_update=progress.update)
    timeline = TimelineWriter(out / "nvml_timeline.jsonl") if interval > 0 else None
    sampler = Sampler(interval, timeline).start() if timeline is not None else None
    try:
        harness.run()
    except KeyboardInterrupt:
        harness.interrupt()
        return True
    finally:
        if sampler is not None and timeline is not None:
            sampler.stop()
            timeline.close()
            notes.append(f"nvml: {sampler.samples} samples of {len(sampler.devices)} "
                         f"device(s) every {interval * 1000:g} ms in {timeline.path.name}")
    return False


def _rerun_suspects(cfg: RunConfig, label: str, specs: list[WorkerSpec], out: Path,
                    results_path: Path, run_id: str, progress: Progress,
                    notes: list[str]) -> bool:
    """The wrong-device check: cases of this pass that went wrong with another device current
    run again with their target current, in fresh workers, records to rerun.jsonl."""
    bad = suspects([r for r in results.cases(results_path) if r.get("run_id") == run_id],
                   label)
    reruns, controls = [], []
    for spec in specs:
        mine = sorted({r["case"] for r in bad if r["device"] == spec.label})
        if not mine:
            continue
        only = out / "workers" / f"{spec.label.replace(':', '')}.rerun.txt"
        only.write_text("\n".join(mine) + "\n")
        args = [*spec.pytest_args, "--gpucheck-only", str(only)]
        reruns.append(WorkerSpec(spec.label, spec.device_index, spec.uuid, spec.suites,
                                 label + RERUN_SUFFIX, _pass_env(label, cfg, TARGET_CURRENT),
                                 args))
        # the control: the same arrangement as the first time, in a fresh worker; a failure
        # that does not come back (a random input, a race) is no evidence of a device bug
        controls.append(WorkerSpec(spec.label, spec.device_index, spec.uuid, spec.suites,
                                   label + CONTROL_SUFFIX, _pass_env(label, cfg, OTHER_CURRENT),
                                   args))
    if not reruns:
        return False
    notes.append(f"wrong-device check: {len(bad)} case(s) that went wrong with another device "
                 f"current ran again, with their target current and (control) with the other "
                 f"device current again ({RERUN_FILE})")
    for specs_ in (reruns, controls):
        if _run_harness(specs_, out, out / RERUN_FILE, run_id, cfg.timeout, progress, notes,
                        0.0):
            return True
    return False


def _diagnose(out: Path, results_path: Path, run_id: str) -> list[dict[str, Any]]:
    """Run-level detectors over every record; their findings become diagnosis records."""
    records = [r for r in results.cases(results_path) if r.get("run_id") == run_id]
    if (out / RERUN_FILE).exists():
        records += [r for r in results.cases(out / RERUN_FILE) if r.get("run_id") == run_id]
    header = next((r for r in results.read(results_path)
                   if r.get("record") == "run" and r.get("run_id") == run_id), {})
    names = {str(d.get("uuid")): str(d.get("device")) for d in header.get("devices", [])}
    totals = {str(d.get("device")): int(d["memory_total"]) for d in header.get("devices", [])
              if d.get("memory_total")}
    made = []
    for detector in (WrongDevice(), StrayContext(names), Numerics(), OomAnomaly(totals),
                     Imbalance()):
        for finding in detector.run_finished(records):
            mine = [r for r in records if (r["device"], r["suite"], r["case"]) ==
                    (finding.device, finding.suite, finding.case)]
            original = next((r for r in mine if "|" not in r["mode"]), mine[0])
            record = {"schema": results.SCHEMA_ID, "record": "diagnosis", "run_id": run_id,
                      "device": finding.device, "suite": finding.suite, "case": finding.case,
                      "mode": original["mode"], "findings": [asdict(finding)]}
            results.append(results_path, record)
            made.append(record)
    return made


def _end_record(results_path: Path, run_id: str, interrupted: bool, reason: str | None,
                stopped_by: str | None = None) -> None:
    results.append(results_path, {
        "schema": results.SCHEMA_ID, "record": "end", "run_id": run_id,
        "finished_at": datetime.now().astimezone().isoformat(timespec="milliseconds"),
        "interrupted": interrupted, "reason": reason, "stopped_by": stopped_by,
    })


#: width of the tables in a log (no terminal, no COLUMNS): wide enough not to fold a name
LOG_WIDTH = 160


def make_console() -> Console:
    """The console of a run: rich decides from the stream whether it is a terminal (colour,
    live progress) or a log (plain text, no redraws); long lines are never wrapped."""
    console = Console(soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = LOG_WIDTH
    return console


def _finish(cfg: RunConfig, out: Path, results_path: Path, run_id: str, notes: list[str],
            not_runnable: dict[str, str], stopped_by: str | None, console: Console) -> int:
    """End record, run-level diagnoses, reports, the summary, and the exit code: the run's
    verdict (gpucheck.report.verdict) decides it, as it decides every report's."""
    stopped = (f"stopped by {stopped_by}: finished cases were kept; `gpucheck run --resume "
               f"{out}` runs the rest") if stopped_by is not None else None
    _end_record(results_path, run_id, stopped is not None, stopped, stopped_by)
    _diagnose(out, results_path, run_id)
    done = publish(out, formats=cfg.report_formats, allow_empty=cfg.allow_empty,
                   stopped_by=stopped_by)
    summarize(console, done, notes, not_runnable, results_path, stopped)
    return done.verdict.exit_code


def summarize(console: Console, done: Published, notes: list[str],
              not_runnable: dict[str, str], results_path: Path, stopped: str | None) -> None:
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
    console.print(Text.assemble((f"{done.verdict.name} (exit {done.verdict.exit_code})", style),
                                f": {line}"))
