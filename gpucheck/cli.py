"""gpucheck's command line. Thin: parse, build a config, call one pipeline function.

Exit codes for every command: 0 clean, 1 findings of severity error, 2 usage or environment
error (one sentence, no traceback). ``gpucheck run`` and ``gpucheck report`` exit with their
run's verdict (gpucheck.report.verdict): 2 also when nothing was tested, the run was
interrupted, or its results could not all be read.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

import gpucheck
from gpucheck.errors import EXIT_CLEAN, EXIT_USAGE, GpucheckError
from gpucheck.model.layout import REPORTS

if TYPE_CHECKING:  # `gpucheck run` starts its workers before rich or NVML is imported
    from gpucheck.devices import Inventory

GIB = 1024**3
#: report formats (gpucheck.report.FORMATS: the run folder's table, so that --help imports
#: no report)
FORMATS = tuple(REPORTS)
MODES = (
    "blocking",
    "nvml",
    "sanitizer",
    "sanitizer:memcheck",
    "sanitizer:racecheck",
    "sanitizer:initcheck",
    "sanitizer:synccheck",
)
FORMAT_HELP = (
    "Report to write (repeatable): html (report.html), json (results.json), junit "
    "(junit.xml), sarif (results.sarif, SARIF 2.1.0 for code scanning). Default: "
    "html, json and junit; given, only the formats named."
)


def _gib(value: int | None) -> str:
    return "N/A" if value is None else f"{value / GIB:.2f} GiB"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(gpucheck.__version__, prog_name="gpucheck")
def cli() -> None:
    """Find the bugs of multi-GPU PyTorch CUDA extensions before your users do."""


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def devices(as_json: bool) -> int:
    """List every visible CUDA device, its memory, processes and peer access.

    Exit 0 when at least one CUDA device is usable, 2 when none is (the reason is printed), so
    that `gpucheck devices` can gate a job that needs a GPU.
    """
    from gpucheck.devices import discover

    inv = discover()
    if as_json:
        click.echo(
            json.dumps({"gpucheck_version": gpucheck.__version__, **inv.to_json()}, indent=2)
        )
    else:
        _print_inventory(inv)
    if inv.environment_error or not inv.devices:
        return EXIT_USAGE
    return EXIT_CLEAN


def _print_inventory(inv: Inventory) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True)
    versions = (
        f"driver {inv.driver_version or 'N/A'}, CUDA (driver) "
        f"{inv.cuda_driver_version or 'N/A'}, torch {inv.torch_version or 'not installed'}"
    )
    if not inv.devices:
        console.print(inv.reason)
        console.print(versions)
        return
    table = Table(title=f"{len(inv.devices)} visible CUDA device(s); {versions}")
    for col in ("cuda", "nvml", "name", "cc", "uuid", "pci", "total", "free", "util"):
        table.add_column(col)
    for d in inv.devices:
        table.add_row(
            str(d.cuda_index),
            str(d.nvml_index),
            d.name,
            d.compute_capability or "N/A",
            d.uuid,
            d.pci_bus_id or "N/A",
            _gib(d.memory_total),
            _gib(d.memory_free),
            "N/A" if d.utilization_gpu is None else f"{d.utilization_gpu}%",
        )
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
            peer.add_row(
                f"cuda:{d.cuda_index}",
                *("-" if v is None else ("yes" if v else "no") for v in d.peer_access),
            )
        console.print(peer)
    for note in inv.notes:
        console.print(f"note: {note}")


@cli.command()
@click.option("--all-devices", is_flag=True, help="Target every visible CUDA device (default).")
@click.option(
    "--device",
    "device_indices",
    type=click.IntRange(min=0),
    multiple=True,
    metavar="N",
    help="Target CUDA device N (repeatable).",
)
@click.option(
    "--suite",
    "suites",
    multiple=True,
    metavar="NAME|PATH",
    help="Suite to run: a folder name under suites/ or a path (repeatable; default: every suite).",
)
@click.option(
    "--mode",
    "modes",
    multiple=True,
    type=click.Choice(MODES),
    help="Instrumentation (repeatable; default: blocking + nvml).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Output folder for a new run; must be empty or absent "
    "(default: a new reports/<timestamp>/).",
)
@click.option(
    "--resume",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help="Continue the interrupted run in DIR with its own settings: cases already "
    "recorded there are not run again.",
)
@click.option(
    "--allow-empty",
    is_flag=True,
    help="Exit 0 even when no case ran (by default a run that tested nothing exits 2).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=900.0,
    show_default=True,
    metavar="SECONDS",
    help="A case running longer than this is recorded as hung.",
)
@click.option(
    "--nvml-interval",
    type=click.FloatRange(min=1),
    default=50.0,
    show_default=True,
    metavar="MS",
    help="NVML sampling period of mode nvml, in milliseconds.",
)
@click.option("--quiet", is_flag=True, help="No live progress; one line per worker.")
@click.option("--cpu-only", is_flag=True, help="Run without a GPU (GPU cases are skipped).")
@click.option(
    "--distributed",
    is_flag=True,
    help="Run the suites (default: dist) as ONE torch.distributed group: one rank per "
    "target device (NCCL), or --world-size CPU ranks (gloo) with --cpu-only; "
    "under torchrun, the rank torchrun gives this process; with --ray, one rank per GPU "
    "of every node.",
)
@click.option(
    "--world-size",
    type=click.IntRange(min=1, max=64),
    default=None,
    metavar="N",
    help="Ranks of a --distributed --cpu-only run (default 2).",
)
@click.option(
    "--backend",
    type=click.Choice(["nccl", "gloo"]),
    default=None,
    help="torch.distributed backend of --distributed (default: nccl on GPUs, gloo on CPU).",
)
@click.option("--format", "formats", multiple=True, type=click.Choice(FORMATS), help=FORMAT_HELP)
@click.option(
    "--wait-for-devices",
    type=click.FloatRange(min=0),
    default=0.0,
    envvar="GPUCHECK_WAIT_FOR_DEVICES",
    show_default=True,
    metavar="SECONDS",
    help="When another gpucheck run holds a target GPU (or the run folder to "
    "resume), wait up to this long for it; 0 refuses at once, naming that run.",
)
@click.option(
    "--shard",
    callback=lambda ctx, param, value: _shard(value),
    default=None,
    metavar="I/N",
    help="Run shard I of N of the planned cases (one per CI job or Slurm array task; "
    "`gpucheck merge` joins their run folders). Every device of a shard runs the same cases.",
)
@click.option(
    "--durations",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    metavar="RUN",
    help="Balance --shard by the case durations of an earlier run (its folder or its "
    "results.jsonl); without it, by the number of cases.",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="local",
    default=None,
    metavar="[ADDRESS]",
    help="Run on every GPU of every node of a Ray cluster (ADDRESS, e.g. ray://head:10001 "
    "or auto; without it, a local Ray instance), into one run folder here; with --cpu-only, "
    "on a cluster without GPUs too. Needs "
    'python -m pip install "ray[client]>=2.40" (the extra [ray]).',
)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    all_devices: bool,
    device_indices: tuple[int, ...],
    suites: tuple[str, ...],
    modes: tuple[str, ...],
    out: Path | None,
    resume: Path | None,
    allow_empty: bool,
    timeout: float,
    nvml_interval: float,
    quiet: bool,
    cpu_only: bool,
    distributed: bool,
    world_size: int | None,
    backend: str | None,
    formats: tuple[str, ...],
    wait_for_devices: float,
    shard: tuple[int, int] | None,
    durations: Path | None,
    ray_address: str | None,
    pytest_args: tuple[str, ...],
) -> int:
    """Run the suites on every target device, each in its own process.

    Arguments after `--` go to pytest (e.g. `-- -k forward`). An option that cannot apply
    to the run asked for (--device with --cpu-only, --nvml-interval without mode nvml, ...)
    is refused. `[tool.gpucheck]` in the current folder's pyproject.toml sets the defaults
    of --suite, --mode, --timeout and --format (suites, modes, timeout, formats); options
    given here override them.
    """
    from gpucheck.controller.config import RunConfig, project_settings
    from gpucheck.controller.entry import run as run_pipeline

    if resume is None:  # a resumed run keeps its own settings
        project = project_settings(Path.cwd(), MODES, FORMATS)
        if not distributed:  # the distributed run has its own suite and no modes
            suites = suites or project.get("suites", ())
            if not cpu_only:
                modes = modes or project.get("modes", ())
        if "timeout" not in _given(ctx):
            timeout = project.get("timeout", timeout)
        formats = formats or project.get("formats", ())
    return run_pipeline(
        RunConfig(
            all_devices,
            device_indices,
            suites,
            modes,
            out,
            timeout,
            quiet,
            cpu_only,
            list(pytest_args),
            nvml_interval / 1000,
            allow_empty=allow_empty,
            resume=resume,
            distributed=distributed,
            world_size=world_size,
            backend=backend,
            formats=tuple(dict.fromkeys(formats)),
            wait_for_devices=wait_for_devices,
            given=_given(ctx),
            shard=shard,
            durations=durations,
            ray=ray_address,
        )
    )


@cli.command()
@click.argument(
    "folders",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The merged run folder (default: a new reports/<timestamp>/).",
)
@click.option("--format", "formats", multiple=True, type=click.Choice(FORMATS), help=FORMAT_HELP)
@click.option(
    "--allow-incomplete",
    is_flag=True,
    help="Merge even when a shard of the plan is missing or a planned case has no record: "
    "the merged report's verdict is then incomplete (exit 2), never passed.",
)
def merge(
    folders: tuple[Path, ...], out: Path | None, formats: tuple[str, ...], allow_incomplete: bool
) -> int:
    """Merge the run folders of several jobs (the shards of --shard, the same suites on
    several machines) into one run folder and its reports; exits with its verdict.

    Refused, in one sentence: folders of different gpucheck versions or settings, an
    unfinished run, a case on the same device in two folders, a shard of the plan missing or
    a planned case without a record (unless --allow-incomplete).
    """
    from gpucheck.controller.merge import merge as merge_runs

    return merge_runs(list(folders), out, tuple(dict.fromkeys(formats)), allow_incomplete)


def _shard(value: str | None) -> tuple[int, int] | None:
    """``--shard I/N`` as (I, N); a value that names no shard is refused in one sentence."""
    from gpucheck.model.shard import ShardError, parse_spec

    if value is None:
        return None
    try:
        return parse_spec(value)
    except ShardError as err:
        raise click.BadParameter(str(err)) from None


def _given(ctx: click.Context) -> frozenset[str]:
    """The parameters of this command that the user set (command line or environment)."""
    from click.core import ParameterSource

    return frozenset(
        name
        for name in ctx.params
        if ctx.get_parameter_source(name)
        in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    )


@cli.command()
@click.option("--all-devices", is_flag=True, help="Target every visible CUDA device (default).")
@click.option(
    "--sanitizer",
    "with_sanitizer",
    is_flag=True,
    help="Also run the compute-sanitizer passes: memcheck, racecheck, initcheck "
    "(each runs only the cases marked for its tool).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Output folder (default: a new reports/<timestamp>/).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="Per-case timeout.",
)
def selftest(all_devices: bool, with_sanitizer: bool, out: Path | None, timeout: float) -> int:
    """Run the harness over deliberately broken extensions and print defect x detector.

    Exit 0 when every defect is found by its detector and no clean case has a finding, 1 when
    one is missed or a clean case has one, 2 when some defects could not run here (they need
    a second GPU, or --sanitizer).
    """
    from gpucheck.selftest.command import run as run_selftest

    return run_selftest(all_devices, with_sanitizer, out, timeout)


@cli.command("parse-sanitizer")
@click.argument("log", type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path))
@click.option(
    "--tool",
    type=click.Choice(["memcheck", "racecheck", "initcheck", "synccheck"]),
    default=None,
    help="The tool that wrote LOG (default: guessed from its content).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def parse_sanitizer(log: Path, tool: str | None, as_json: bool) -> int:
    """Turn a compute-sanitizer --log-file into findings (exit 1 if any is an error)."""
    from rich.console import Console
    from rich.markup import escape

    from gpucheck.errors import UsageProblem
    from gpucheck.sanitizer import parse_file

    report = parse_file(log, tool)
    if report.tool is None and not report.findings:
        raise UsageProblem(
            f"{log} does not look like compute-sanitizer output (no '========= ' lines)"
        )
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        console = Console(soft_wrap=True)
        console.print(
            f"{report.tool}: {report.errors_reported} error(s) reported, "
            f"{report.errors_printed} printed, {len(report.findings)} distinct"
        )
        for f in report.findings:
            where = f.kernel_name or f.api_call or ""
            line = (
                f"[{f.severity}] {f.error} x{f.count} {where} {f.source or ''} "
                f"{f.python_frame or ''}"
            )
            console.print(escape(line.rstrip()))
    errors = any(f.severity == "error" for f in report.findings) or bool(report.errors_reported)
    return 1 if errors else EXIT_CLEAN


@cli.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where the HTML page goes (default: RUN_DIR/report.html).",
)
@click.option("--format", "formats", multiple=True, type=click.Choice(FORMATS), help=FORMAT_HELP)
def report(run_dir: Path, output: Path | None, formats: tuple[str, ...]) -> int:
    """Write the reports (report.html, results.json, junit.xml; --format) of the run in RUN_DIR.

    Works on an interrupted run too. Prints the run's verdict, its findings (diagnoses
    first, one line per kind and op), and exits with the verdict: 0 passed
    (or warnings), 1 findings of severity error, 2 nothing tested, interrupted, or lines of
    results.jsonl that could not be read (each named).
    """
    from rich.console import Console
    from rich.text import Text

    from gpucheck.errors import UsageProblem
    from gpucheck.model.layout import RunFolder
    from gpucheck.report import DEFAULT_FORMATS, publish
    from gpucheck.report.console import print_findings, print_verdict

    if not RunFolder(run_dir).results.exists() and not RunFolder(run_dir).workers.is_dir():
        raise UsageProblem(f"{run_dir} is not a gpucheck run folder (no results.jsonl)")
    if output is not None and formats and "html" not in formats:
        raise UsageProblem(
            "-o sets where the HTML page goes, and --format does not ask for "
            "html: drop -o or add --format html"
        )
    try:
        done = publish(run_dir, output, tuple(dict.fromkeys(formats)) or DEFAULT_FORMATS)
    except OSError as err:
        where = output or run_dir
        why = err.strerror or str(err)
        if err.filename and Path(err.filename) != where:
            why = f"{err.filename}: {why}"
        raise UsageProblem(f"cannot write the report {where}: {why}") from err
    console = Console(soft_wrap=True)
    paths = list(done.paths.values())
    first = done.paths.get("html", paths[0] if paths else run_dir)
    others = [p for p in paths if p != first]
    also = f"  (also {', '.join(p.name for p in others)})" if others else ""
    console.print(Text(f"{done.verdict.name}: {first}{also}"))
    print_findings(console, done.grouped)
    print_verdict(console, done.verdict)
    return done.verdict.exit_code


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    w, sep, h = value.lower().partition("x")
    if (
        not sep
        or not w.isdigit()
        or not h.isdigit()
        or not (0 < int(w) <= 65536)
        or not (0 < int(h) <= 65536)
    ):
        raise click.BadParameter(f"expected WIDTHxHEIGHT such as 1920x1080, got {value!r}")
    return int(w), int(h)


@cli.command("lint-checkpoint")
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option(
    "--render",
    "render",
    callback=_size,
    default=None,
    metavar="WxH",
    help="Also estimate the Gaussian-tile overlaps and binning bytes of a WxH render "
    "of the scene, loaded with 3DGS conventions and loaded correctly.",
)
def lint_checkpoint(paths: tuple[Path, ...], as_json: bool, render: tuple[int, int] | None) -> int:
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
        rv = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="gpucheck",
            standalone_mode=False,
        )
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
