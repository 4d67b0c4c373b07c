"""Live progress per worker (rich) and the end-of-run summary table."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from rich import progress as rp
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from gpucheck.runner.harness import Worker


class Progress:
    """One progress bar per worker: cases done / total, current case, findings so far."""

    def __init__(self, console: Console, quiet: bool) -> None:
        self.quiet = quiet
        self.console = console
        self.bar = rp.Progress(
            rp.TextColumn("[bold]{task.fields[label]}"), rp.BarColumn(),
            rp.MofNCompleteColumn(), rp.TextColumn("findings {task.fields[findings]}"),
            rp.TextColumn("{task.fields[case]}"), console=console, disable=quiet,
            transient=False,
        )
        self.tasks: dict[int, rp.TaskID] = {}
        self.reported: set[int] = set()

    def __enter__(self) -> Progress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def update(self, w: Worker) -> None:
        label = f"{w.spec.label} {w.spec.mode}"
        key = hash(label)
        st = w.state
        case = (st.get("case") or "").rsplit("::", 1)[-1][:60]
        if w.generation:
            case = f"(worker {w.generation + 1}) {case}"
        if key not in self.tasks:
            self.tasks[key] = self.bar.add_task("", total=None, label=label, findings=0, case="")
        done = w.finished and not w.replaced
        self.bar.update(self.tasks[key], total=w.planned, completed=w.done,
                        findings=st.get("findings", 0), case="done" if done else case)
        if self.quiet and done and key not in self.reported:
            self.reported.add(key)
            restarts = f", {w.generation} restart(s)" if w.generation else ""
            self.console.print(f"{label}: {w.done}/{w.planned or '?'} cases{restarts}, "
                               f"exit {w.proc.returncode}")


def summary_table(records: list[dict[str, Any]]) -> Table:
    """Device x suite -> counts per status."""
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for r in records:
        counts[(r["device"], r["suite"])][r["status"]] += 1
    table = Table(title="gpucheck summary")
    for col in ("device", "suite", "passed", "failed", "error", "crashed", "hung", "skipped"):
        table.add_column(col, justify="left" if col in ("device", "suite") else "right")
    for (device, suite), c in sorted(counts.items()):
        bad = c["failed"] + c["error"] + c["crashed"] + c["hung"]
        style = "red" if bad else "green"
        table.add_row(device, suite, *(str(c[s]) for s in ("passed", "failed", "error",
                      "crashed", "hung", "skipped")), style=style)
    return table


#: statuses of a case that ran (a skipped case did not)
RAN = ("passed", "failed", "error", "crashed", "hung")


def summary_line(records: list[dict[str, Any]], reasons: int = 3) -> tuple[str, int]:
    """The run's last line: how many cases ran, passed, failed..., were skipped and why.

    Returns the line and the number of cases that ran.
    """
    counts = Counter(r["status"] for r in records)
    ran = sum(counts[s] for s in RAN)
    parts = ", ".join(f"{counts[s]} {s}" for s in RAN if counts[s] or s in ("passed", "failed"))
    line = f"{len(records)} case(s): {ran} ran ({parts}), {counts['skipped']} skipped"
    why = Counter(r.get("reason") or "no reason given" for r in records
                  if r["status"] == "skipped")
    if why:
        top = "; ".join(f"{reason} ({n})" for reason, n in why.most_common(reasons))
        more = f"; {len(why) - reasons} more reason(s)" if len(why) > reasons else ""
        line += f": {top}{more}"
    return line, ran
