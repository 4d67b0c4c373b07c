"""What the checks cost: how much of a run was gpucheck's own time, not the cases'.

A case's ``duration_s`` holds its body and fixtures (what plain pytest would spend too) and
gpucheck's own seconds inside it (``cost_s``: each detector, its checks around extension-op
calls included; the launch trace's and the watch's own part of those, ``launch-trace`` and
``op-watch``, counted with the detectors; the worker's bookkeeping). The rest of the
wall time of a run is gpucheck's as well: starting the workers and finding the devices before
the first case, a pass that runs cases an earlier pass ran (a sanitizer pass, the
wrong-device re-runs), the reports after the last case. Passes run one after another;
within a pass the devices run at once, so a pass is as long as its busiest device.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpucheck.model.fleet import node_of
from gpucheck.model.results import BOOKKEEPING, CaseRecord


@dataclass
class Cost:
    """Seconds of a run: its wall time, the cases' own time, and gpucheck's by stage."""

    wall: float
    cases: float  # the busiest device's case time, gpucheck's seconds inside it left out
    detectors: dict[str, float] = field(default_factory=dict)
    bookkeeping: float = 0.0
    reruns: float = 0.0  # the busiest device's re-run passes

    @property
    def own(self) -> float:
        """gpucheck's own seconds: everything of the wall time that was not a case's."""
        return max(0.0, self.wall - self.cases)

    @property
    def outside_cases(self) -> float:
        """Start-up, the time between cases and the reports (what no record times)."""
        inside = sum(self.detectors.values()) + self.bookkeeping + self.reruns
        return max(0.0, self.own - inside)


def run_cost(
    records: Iterable[CaseRecord],
    wall: float,
    reruns: Iterable[CaseRecord] = (),
    merged: bool = False,
) -> Cost:
    """The split of a run of ``wall`` seconds, from its case records (``reruns``: those of
    the wrong-device re-runs, kept apart from the run's). A pass (a mode) whose cases an
    earlier pass ran already repeats them for gpucheck's checks: it counts as re-runs.
    ``merged``: the run was merged from runs of several machines (``host/cuda:0``), whose
    wall times add up: the busiest device of each machine counts."""
    passes: dict[str, dict[str, list[CaseRecord]]] = {}  # mode -> device -> its records
    for r in records:
        if not r.harness_made:
            passes.setdefault(r.mode, {}).setdefault(r.device, []).append(r)
    cost = Cost(wall=wall, cases=0.0)
    seen: set[tuple[str, str]] = set()
    for by_device in passes.values():
        cases = {(r.suite, r.case) for rs in by_device.values() for r in rs}
        if cases & seen:  # the same cases again: gpucheck's
            cost.reruns += max(sum(r.duration_s for r in rs) for rs in by_device.values())
            continue
        seen |= cases
        machines: dict[str | None, list[list[CaseRecord]]] = {}
        for device, rs in by_device.items():
            machines.setdefault(node_of(device) if merged else None, []).append(rs)
        busiest = [
            r
            for lists in machines.values()
            for r in max(lists, key=lambda rs: sum(r.duration_s for r in rs))
        ]
        for r in busiest:
            spent = r.cost_s or {}
            for name, seconds in spent.items():
                if name == BOOKKEEPING:
                    cost.bookkeeping += seconds
                else:
                    cost.detectors[name] = cost.detectors.get(name, 0.0) + seconds
            cost.cases += max(0.0, r.duration_s - sum(spent.values()))
    rerun_time: dict[str, float] = {}  # device -> its re-runs' seconds
    for r in reruns:
        rerun_time[r.device] = rerun_time.get(r.device, 0.0) + r.duration_s
    cost.reruns += max(rerun_time.values(), default=0.0)
    return cost


def cost_line(cost: Cost) -> str:
    """One line for the end of a run: gpucheck's own share and where it went."""
    if cost.wall <= 0:
        return "gpucheck's own time: unknown (the run has no duration)"
    share = 100 * cost.own / cost.wall
    parts = [f"detectors {sum(cost.detectors.values()):.1f} s"]
    top = sorted(cost.detectors.items(), key=lambda kv: -kv[1])[:2]
    if top and top[0][1] >= 0.05:
        parts[0] += " (" + ", ".join(f"{n} {s:.1f}" for n, s in top if s >= 0.05) + ")"
    parts += [
        f"records {cost.bookkeeping:.1f} s",
        f"re-runs {cost.reruns:.1f} s",
        f"start-up, between cases and reports {cost.outside_cases:.1f} s",
    ]
    return (
        f"gpucheck's own time: {cost.own:.1f} s of {cost.wall:.1f} s ({share:.0f} %): "
        + ", ".join(parts)
    )
