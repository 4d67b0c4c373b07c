"""``gpucheck run``: from a RunConfig to results.jsonl, junit.xml and an exit code."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rich.console import Console

import gpucheck
from gpucheck import devices as devices_mod
from gpucheck.errors import EXIT_CLEAN, EXIT_FINDINGS, EnvironmentProblem, UsageProblem
from gpucheck.report import junit, results
from gpucheck.runner import suites as suites_mod
from gpucheck.runner.harness import Harness, WorkerSpec
from gpucheck.runner.nvml_sampler import DEFAULT_INTERVAL_S, Sampler, TimelineWriter
from gpucheck.runner.progress import Progress, summary_table
from gpucheck.sanitizer import command as sanitizer_cmd

DEFAULT_MODES = ("blocking", "nvml")


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


def prepare_out(out: Path | None) -> Path:
    """Create the output folder (default reports/<timestamp>/) and prove it is writable."""
    path = out or Path("reports") / datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".gpucheck-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UsageProblem(f"cannot write to the output folder {str(path)!r}: "
                           f"{err.strerror or err}") from err
    return path


Target = tuple[str, int | None, str | None, str | None]  # label, CUDA index, UUID, name


def choose_targets(cfg: RunConfig) -> tuple[list[Target], list[str], str | None]:
    """Each target, notes for the run header, and the driver version."""
    if cfg.cpu_only:
        return ([("cpu", None, None, None)],
                ["--cpu-only: GPUs hidden; cases that need one are skipped"], None)
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
            inv.driver_version)


def plan_passes(modes: tuple[str, ...]) -> list[tuple[str, str | None]]:
    """(mode label, sanitizer tool) of each pass: blocking/nvml share one worker per device;
    every sanitizer tool needs its own."""
    passes: list[tuple[str, str | None]] = []
    plain = [m for m in ("blocking", "nvml") if m in modes]
    if plain:
        passes.append(("+".join(plain), None))
    for m in modes:
        if m.startswith("sanitizer"):
            tool = sanitizer_cmd.tool_of(m)
            if (f"sanitizer:{tool}", tool) not in passes:
                passes.append((f"sanitizer:{tool}", tool))
    return passes


def run(cfg: RunConfig) -> int:
    """Run the suites on every target device; returns the exit code of the whole run."""
    if cfg.all_devices and cfg.devices:
        raise UsageProblem("--all-devices and --device exclude each other")
    modes = tuple(dict.fromkeys(cfg.modes)) or DEFAULT_MODES
    sanitizer = None
    if any(m.startswith("sanitizer") for m in modes):
        if cfg.cpu_only:
            raise UsageProblem("the sanitizer modes need a GPU; drop --cpu-only")
        sanitizer = sanitizer_cmd.find()
    targets, notes, driver = choose_targets(cfg)
    if cfg.cpu_only and "nvml" in modes:
        modes = tuple(m for m in modes if m != "nvml")
        notes.append("--cpu-only: mode 'nvml' has no GPU to sample")
    passes = plan_passes(modes) or [("plain", None)]
    out = prepare_out(cfg.out)
    suites = suites_mod.resolve(cfg.suites)
    results_path = out / "results.jsonl"
    run_id = uuid.uuid4().hex[:12]
    results.append(results_path, {
        "schema": results.SCHEMA_ID, "record": "run", "run_id": run_id,
        "started_at": datetime.now().astimezone().isoformat(timespec="milliseconds"),
        "gpucheck_version": gpucheck.__version__,
        "torch_version": devices_mod.torch_version(),
        "driver_version": driver,
        "devices": [{"device": label, "uuid": u, "name": name} for label, _, u, name in targets],
        "suites": sorted(suites), "modes": [label for label, _ in passes], "notes": notes,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    })
    console = Console(stderr=False, quiet=False)
    interrupted = False
    with Progress(console, quiet=cfg.quiet) as progress:
        for label, tool in passes:
            env: dict[str, str] = {}
            if "blocking" in label.split("+"):
                env["CUDA_LAUNCH_BLOCKING"] = "1"
            if cfg.cpu_only:
                env["CUDA_VISIBLE_DEVICES"] = ""
            interval = cfg.nvml_interval if "nvml" in label.split("+") else 0.0
            specs = [WorkerSpec(t_label, index, u, suites, label, env, cfg.pytest_args, interval,
                                tool, sanitizer) for t_label, index, u, _ in targets]
            harness = Harness(specs, out, results_path, run_id, cfg.timeout,
                              on_update=progress.update)
            timeline = TimelineWriter(out / "nvml_timeline.jsonl") if interval > 0 else None
            sampler = Sampler(interval, timeline).start() if timeline is not None else None
            try:
                harness.run()
            except KeyboardInterrupt:
                interrupted = True
                harness.interrupt()
            finally:
                if sampler is not None and timeline is not None:
                    sampler.stop()
                    timeline.close()
                    notes.append(f"nvml: {sampler.samples} samples of {len(sampler.devices)} "
                                 f"device(s) every {interval * 1000:g} ms in "
                                 f"{timeline.path.name}")
            if interrupted:
                break
    junit_path = junit.write(results_path, out / "junit.xml")
    records = results.cases(results_path)
    console.print(summary_table(records))
    for note in notes:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"results: {results_path}  junit: {junit_path}")
    if interrupted:
        console.print("[yellow]interrupted: finished cases were kept[/]")
        return 130
    return EXIT_FINDINGS if results.has_errors(records) else EXIT_CLEAN
