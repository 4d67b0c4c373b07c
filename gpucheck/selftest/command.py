"""``gpucheck selftest``: the defect builds made, the harness run over them, the matrix of
defect x detector and the zoo's table printed, and the verdict (:func:`run`, what the
command calls)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def run(all_devices: bool, with_sanitizer: bool, out: Path | None, timeout: float) -> int:
    """Build the defects, run the self-test's suite on the targets, print what it found;
    the exit code of :func:`gpucheck.selftest.verdict`."""
    import shutil
    import tempfile

    from gpucheck import _resources
    from gpucheck import selftest as st
    from gpucheck.controller.config import RunConfig, prepare_out
    from gpucheck.controller.entry import run as run_pipeline

    need_gpu()
    modes = ("blocking", "nvml", *(st.SANITIZER_MODES if with_sanitizer else ()))
    run_dir = prepare_out(out)
    with tempfile.TemporaryDirectory(prefix="gpucheck-builds-") as tmp:
        click.echo("gpucheck selftest: building the defect builds (cached after the first run)")
        failed = st.prebuild(Path(tmp))
        # the bundled suite by its path: a folder named selftest here (the run folder itself,
        # with --out selftest) must not stand in for it
        suite = str(_resources.suites() / "selftest")
        cfg = RunConfig(
            all_devices=all_devices,
            suites=(suite,),
            modes=modes,
            out=run_dir,
            timeout=timeout,
            quiet=True,
        )
        run_pipeline(cfg)  # its exit code is 1 by design: the defects are findings
        if failed is not None:
            shutil.copytree(tmp, run_dir / "defect_builds")
    if failed:
        click.echo(
            f"gpucheck selftest: defect builds that failed: {', '.join(failed)} "
            f"(compiler output in {run_dir / 'defect_builds'})",
            err=True,
        )
    records, gpus = st.read_run(run_dir)
    rows, false = st.matrix(records, gpus)
    zoo = st.zoo_matrix(records, gpus)
    print_matrix(rows, false)
    print_zoo(zoo)
    return st.verdict(rows, false, zoo)


def need_gpu() -> None:
    """The self-test runs deliberately broken CUDA kernels: without a usable GPU, say so in
    one sentence before anything is built or written."""
    from gpucheck.devices import discover
    from gpucheck.errors import EnvironmentProblem

    inv = discover()
    if inv.environment_error or not inv.devices:
        reason = (inv.environment_error or inv.reason or "no CUDA device is visible").rstrip(".")
        raise EnvironmentProblem(
            f"gpucheck selftest needs a CUDA GPU, and {reason[:1].lower()}"
            f"{reason[1:]}; `gpucheck run --cpu-only` is what runs "
            "without one"
        )


def print_matrix(rows: list[Any], false: list[dict[str, Any]]) -> None:
    """The defect x detector table: each row's result, then the totals and every false
    positive on a clean case."""
    from rich.markup import escape
    from rich.table import Table

    from gpucheck.controller.config import make_console

    console = make_console()  # a log gets the table unfolded, without markup
    table = Table(title="gpucheck selftest: defect x detector")
    for col in ("defect", "detector", "result", "detail"):
        table.add_column(col)
    colour = {"found": "green", "missed": "red", "not run": "yellow"}
    for r in rows:
        table.add_row(
            r.defect.name, r.defect.kind, f"[{colour[r.status]}]{r.status}[/]", escape(r.detail)
        )
    console.print(table)
    found = sum(r.status == "found" for r in rows)
    ran = sum(r.status != "not run" for r in rows)
    console.print(
        f"detected {found} of {ran} defects that ran ({len(rows) - ran} not run); "
        f"false positives on clean cases: {len(false)}"
    )
    for f in false:
        console.print(
            escape(
                f"false positive: {f['device']} {f['case']} ({f['mode']}): "
                f"{f['kind']}: {f['message']}"
            )
        )


def print_zoo(results: list[Any]) -> None:
    """The zoo's table: per row its recall (expected findings found / expected that could run
    here) and its unexpected findings; then the totals and every miss and unexpected finding."""
    from rich.markup import escape
    from rich.table import Table

    from gpucheck.controller.config import make_console

    console = make_console()
    table = Table(title="gpucheck selftest: zoo (real-shaped extensions)")
    for col in ("row", "bugs", "recall", "unexpected", "detail"):
        table.add_column(col)
    for z in results:
        found, could = z.recall
        recall = f"{found}/{could}" if could else "-"
        colour = "red" if z.missed or z.unexpected else "green" if z.ran else "yellow"
        kinds = sorted({u["kind"] for u in z.unexpected})
        detail = "; ".join(
            [
                *(f"not run: {e.kind} ({why})" for e, why in z.not_run),
                *(f"missed: {e.kind} ({why})" for e, why in z.missed),
            ]
        )
        if not z.ran:
            detail = "its cases did not run" + (f"; {detail}" if detail else "")
        table.add_row(
            z.row.name,
            z.row.bugs or "clean twin",
            f"[{colour}]{recall}[/]",
            f"{len(z.unexpected)}" + (f" ({', '.join(kinds)})" if kinds else ""),
            escape(detail),
        )
    console.print(table)
    found = sum(z.recall[0] for z in results)
    could = sum(z.recall[1] for z in results)
    not_run = sum(len(z.not_run) for z in results)
    unexpected = [u for z in results for u in z.unexpected]
    kinds = sorted({u["kind"] for u in unexpected})
    console.print(
        f"zoo: recall {found} of {could} expected findings that could run here "
        f"({not_run} not run); unexpected findings: {len(unexpected)}"
        + (f" ({', '.join(kinds)})" if kinds else "")
    )
    for u in unexpected:
        console.print(
            escape(
                f"unexpected: {u['device']} {u['case']} ({u['mode']}): "
                f"{u['kind']}{' · ' + u['op'] if u['op'] else ''}: "
                f"{u['message']}"
            )
        )
