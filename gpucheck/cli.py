"""gpucheck's command line. Thin: parse, build a config, call one pipeline function.

Exit codes for every command: 0 clean, 1 findings of severity error, 2 usage or environment
error (one sentence, no traceback).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import gpucheck
from gpucheck.devices import Inventory
from gpucheck.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, GpucheckError

GIB = 1024**3


def _gib(value: int | None) -> str:
    return "N/A" if value is None else f"{value / GIB:.2f} GiB"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(gpucheck.__version__, prog_name="gpucheck")
def cli() -> None:
    """Find the bugs of multi-GPU PyTorch CUDA extensions before your users do."""


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def devices(as_json: bool) -> int:
    """List every visible CUDA device, its memory, processes and peer access."""
    from gpucheck.devices import discover

    inv = discover()
    if as_json:
        click.echo(json.dumps({"gpucheck_version": gpucheck.__version__, **inv.to_json()},
                              indent=2))
    else:
        _print_inventory(inv)
    if inv.environment_error:
        return EXIT_USAGE
    return EXIT_CLEAN


def _print_inventory(inv: Inventory) -> None:
    console = Console(soft_wrap=True)
    versions = (f"driver {inv.driver_version or 'N/A'}, CUDA (driver) "
                f"{inv.cuda_driver_version or 'N/A'}, torch {inv.torch_version or 'not installed'}")
    if not inv.devices:
        console.print(inv.reason)
        console.print(versions)
        return
    table = Table(title=f"{len(inv.devices)} visible CUDA device(s); {versions}")
    for col in ("cuda", "nvml", "name", "cc", "uuid", "pci", "total", "free", "util"):
        table.add_column(col)
    for d in inv.devices:
        table.add_row(str(d.cuda_index), str(d.nvml_index), d.name, d.compute_capability or "N/A",
                      d.uuid, d.pci_bus_id or "N/A", _gib(d.memory_total), _gib(d.memory_free),
                      "N/A" if d.utilization_gpu is None else f"{d.utilization_gpu}%")
    console.print(table)
    procs = Table(title="processes with a CUDA context")
    for col in ("cuda", "pid", "name", "memory"):
        procs.add_column(col)
    for d in inv.devices:
        for p in d.processes:
            procs.add_row(str(d.cuda_index), str(p.pid), p.name or "N/A", _gib(p.used_memory))
    console.print(procs if procs.row_count else "processes with a CUDA context: none")
    if len(inv.devices) > 1:
        peer = Table(title="peer access (row can access column)")
        peer.add_column("")
        for d in inv.devices:
            peer.add_column(f"cuda:{d.cuda_index}")
        for d in inv.devices:
            peer.add_row(f"cuda:{d.cuda_index}", *("-" if v is None else ("yes" if v else "no")
                                                     for v in d.peer_access))
        console.print(peer)
    for note in inv.notes:
        console.print(f"note: {note}")


@cli.command()
@click.option("--all-devices", is_flag=True, help="Target every visible CUDA device (default).")
@click.option("--device", "device_indices", type=click.IntRange(min=0), multiple=True,
              metavar="N", help="Target CUDA device N (repeatable).")
@click.option("--suite", "suites", multiple=True, metavar="NAME|PATH",
              help="Suite to run: a folder name under suites/ or a path (repeatable; "
                   "default: every suite).")
@click.option("--mode", "modes", multiple=True,
              type=click.Choice(["blocking", "nvml", "sanitizer", "sanitizer:memcheck",
                                 "sanitizer:racecheck", "sanitizer:initcheck",
                                 "sanitizer:synccheck"]),
              help="Instrumentation (repeatable; default: blocking + nvml).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output folder for a new run; must be empty or absent "
                   "(default: a new reports/<timestamp>/).")
@click.option("--resume", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, metavar="DIR",
              help="Continue the interrupted run in DIR with its own settings: cases already "
                   "recorded there are not run again.")
@click.option("--allow-empty", is_flag=True,
              help="Exit 0 even when no case ran (by default a run that tested nothing "
                   "exits 2).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=900.0,
              show_default=True, metavar="SECONDS",
              help="A case running longer than this is recorded as hung.")
@click.option("--nvml-interval", type=click.FloatRange(min=1), default=50.0, show_default=True,
              metavar="MS", help="NVML sampling period of mode nvml, in milliseconds.")
@click.option("--quiet", is_flag=True, help="No live progress; one line per worker.")
@click.option("--cpu-only", is_flag=True, help="Run without a GPU (GPU cases are skipped).")
@click.option("--distributed", is_flag=True,
              help="Run the suites (default: dist) as ONE torch.distributed group: one rank per "
                   "target device (NCCL), or --world-size CPU ranks (gloo) with --cpu-only; "
                   "under torchrun, the rank torchrun gives this process.")
@click.option("--world-size", type=click.IntRange(min=1, max=64), default=None, metavar="N",
              help="Ranks of a --distributed --cpu-only run (default 2).")
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default=None,
              help="torch.distributed backend of --distributed (default: nccl on GPUs, "
                   "gloo on CPU).")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def run(all_devices: bool, device_indices: tuple[int, ...], suites: tuple[str, ...],
        modes: tuple[str, ...], out: Path | None, resume: Path | None, allow_empty: bool,
        timeout: float, nvml_interval: float, quiet: bool, cpu_only: bool, distributed: bool,
        world_size: int | None, backend: str | None, pytest_args: tuple[str, ...]) -> int:
    """Run the suites on every target device, each in its own process.

    Arguments after `--` go to pytest (e.g. `-- -k forward`).
    """
    from gpucheck.errors import UsageProblem
    from gpucheck.runner.pipeline import RunConfig
    from gpucheck.runner.pipeline import run as run_pipeline

    if not distributed and (world_size is not None or backend is not None):
        raise UsageProblem("--world-size and --backend go with --distributed")
    return run_pipeline(RunConfig(all_devices, device_indices, suites, modes, out, timeout,
                                  quiet, cpu_only, list(pytest_args), nvml_interval / 1000,
                                  allow_empty=allow_empty, resume=resume,
                                  distributed=distributed, world_size=world_size,
                                  backend=backend))


@cli.command()
@click.option("--all-devices", is_flag=True, help="Target every visible CUDA device (default).")
@click.option("--sanitizer", "with_sanitizer", is_flag=True,
              help="Also run the compute-sanitizer passes: memcheck, racecheck, initcheck "
                   "(each runs only the cases marked for its tool).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output folder (default: a new reports/<timestamp>/).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0,
              show_default=True, metavar="SECONDS", help="Per-case timeout.")
def selftest(all_devices: bool, with_sanitizer: bool, out: Path | None, timeout: float) -> int:
    """Run the harness over deliberately broken extensions and print defect x detector.

    Exit 0 when every defect is found by its detector and no clean case has a finding, 1 when
    one is missed or a clean case has one, 2 when some defects could not run here (they need
    a second GPU, or --sanitizer).
    """
    import shutil
    import tempfile

    from gpucheck import selftest as st
    from gpucheck.runner.pipeline import RunConfig, prepare_out
    from gpucheck.runner.pipeline import run as run_pipeline

    modes = ("blocking", "nvml", *(st.SANITIZER_MODES if with_sanitizer else ()))
    run_dir = prepare_out(out)
    with tempfile.TemporaryDirectory(prefix="gpucheck-builds-") as tmp:
        click.echo("gpucheck selftest: building the defect builds (cached after the first run)")
        failed = st.prebuild(Path(tmp))
        cfg = RunConfig(all_devices=all_devices, suites=("selftest",), modes=modes,
                        out=run_dir, timeout=timeout, quiet=True)
        run_pipeline(cfg)  # its exit code is 1 by design: the defects are findings
        if failed is not None:
            shutil.copytree(tmp, run_dir / "defect_builds")
    if failed:
        click.echo(f"gpucheck selftest: defect builds that failed: {', '.join(failed)} "
                   f"(compiler output in {run_dir / 'defect_builds'})", err=True)
    rows, false = st.matrix(*st.read_run(run_dir))
    _print_matrix(rows, false)
    return st.verdict(rows, false)


def _print_matrix(rows: list[Any], false: list[dict[str, Any]]) -> None:
    console = Console(soft_wrap=True)
    table = Table(title="gpucheck selftest: defect x detector")
    for col in ("defect", "detector", "result", "detail"):
        table.add_column(col)
    colour = {"found": "green", "missed": "red", "not run": "yellow"}
    for r in rows:
        table.add_row(r.defect.name, r.defect.kind, f"[{colour[r.status]}]{r.status}[/]",
                      escape(r.detail))
    console.print(table)
    found = sum(r.status == "found" for r in rows)
    ran = sum(r.status != "not run" for r in rows)
    console.print(f"detected {found} of {ran} defects that ran ({len(rows) - ran} not run); "
                  f"false positives on clean cases: {len(false)}")
    for f in false:
        console.print(escape(f"false positive: {f['device']} {f['case']} ({f['mode']}): "
                             f"{f['kind']}: {f['message']}"))


@cli.command("parse-sanitizer")
@click.argument("log", type=click.Path(exists=True, dir_okay=False, readable=True,
                                       path_type=Path))
@click.option("--tool", type=click.Choice(["memcheck", "racecheck", "initcheck", "synccheck"]),
              default=None, help="The tool that wrote LOG (default: guessed from its content).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def parse_sanitizer(log: Path, tool: str | None, as_json: bool) -> int:
    """Turn a compute-sanitizer --log-file into findings (exit 1 if any is an error)."""
    from gpucheck.errors import UsageProblem
    from gpucheck.sanitizer import parse_file

    report = parse_file(log, tool)
    if report.tool is None and not report.findings:
        raise UsageProblem(f"{log} does not look like compute-sanitizer output "
                           "(no '========= ' lines)")
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        console = Console(soft_wrap=True)
        console.print(f"{report.tool}: {report.errors_reported} error(s) reported, "
                      f"{report.errors_printed} printed, {len(report.findings)} distinct")
        for f in report.findings:
            where = f.kernel_name or f.api_call or ""
            line = (f"[{f.severity}] {f.error} x{f.count} {where} {f.source or ''} "
                    f"{f.python_frame or ''}")
            console.print(escape(line.rstrip()))
    errors = any(f.severity == "error" for f in report.findings) or bool(report.errors_reported)
    return 1 if errors else EXIT_CLEAN


@cli.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Where the HTML page goes (default: RUN_DIR/report.html).")
def report(run_dir: Path, output: Path | None) -> int:
    """Write report.html, results.json and junit.xml of the run in RUN_DIR.

    Works on an interrupted run too. Exit 1 when the run has findings of severity error.
    """
    from gpucheck.errors import UsageProblem
    from gpucheck.report import write_all

    if not (run_dir / "results.jsonl").exists() and not (run_dir / "workers").is_dir():
        raise UsageProblem(f"{run_dir} is not a gpucheck run folder (no results.jsonl)")
    try:
        paths = write_all(run_dir, output)
    except OSError as err:
        raise UsageProblem(f"cannot write the report: {err.strerror or err}") from err
    verdict = json.loads(paths["json"].read_text())["summary"]["verdict"]
    click.echo(f"{verdict}: {paths['html']}  (also {paths['json'].name}, {paths['junit'].name})")
    return EXIT_FINDINGS if verdict == "failed" else EXIT_CLEAN


def _size(ctx: click.Context, param: click.Parameter, value: str | None
          ) -> tuple[int, int] | None:
    if value is None:
        return None
    w, sep, h = value.lower().partition("x")
    if not sep or not w.isdigit() or not h.isdigit() or not (0 < int(w) <= 65536) or not (
            0 < int(h) <= 65536):
        raise click.BadParameter(f"expected WIDTHxHEIGHT such as 1920x1080, got {value!r}")
    return int(w), int(h)


@cli.command("lint-checkpoint")
@click.argument("paths", nargs=-1, required=True,
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--render", "render", callback=_size, default=None, metavar="WxH",
              help="Also estimate the Gaussian-tile overlaps and binning bytes of a WxH render "
                   "of the scene, loaded with 3DGS conventions and loaded correctly.")
def lint_checkpoint(paths: tuple[Path, ...], as_json: bool, render: tuple[int, int] | None
                    ) -> int:
    """Tell whether 3DGS checkpoints (.ply, .pt) hold raw or already activated parameters.

    Exit 0 every file ok, 1 a file is suspicious or activated, 2 a file is unreadable (the
    reason is printed).
    """
    from gpucheck.checkpoints.lint import lint
    from gpucheck.checkpoints.lint_text import render_text

    reports = [lint(p, render) for p in paths]
    if as_json:
        click.echo(json.dumps([r.to_json() for r in reports], indent=2))
    else:
        for r in reports:
            click.echo(render_text(r))
    return max(r.exit_code for r in reports)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpucheck`` script; returns the exit code."""
    try:
        rv = cli.main(args=list(argv) if argv is not None else None,
                      prog_name="gpucheck", standalone_mode=False)
    except GpucheckError as err:
        click.echo(f"gpucheck: {err}", err=True)
        return err.exit_code
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.ClickException as err:
        err.show()
        return EXIT_USAGE if isinstance(err, click.UsageError) else err.exit_code
    return rv if isinstance(rv, int) else EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main())
