"""What the checks cost: how much of a run was gpucheck's own time, not the cases'.

A case's ``duration_s`` holds its body and fixtures (what plain pytest would spend too) and
gpucheck's own seconds inside it (``cost_s``: each detector, the worker's bookkeeping). The
rest of the wall time of a run is gpucheck's as well: starting the workers and finding the
devices before the first case, the re-run passes that diagnose, the reports after the last
case. Devices run at once, so the run is as long as its busiest device: the split is that
device's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpucheck.model.results import CaseRecord

#: the ``cost_s`` key of the worker's own bookkeeping (every other key is a detector)
BOOKKEEPING = "record"


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


def run_cost(records: Iterable[CaseRecord], wall: float) -> Cost:
    """The split of a run of ``wall`` seconds, from its case records. The first mode a
    device ran is its main pass; cases of later modes are re-runs (gpucheck's)."""
    per_device: dict[str, list[CaseRecord]] = {}
    for r in records:
        if not r.harness_made:
            per_device.setdefault(r.device, []).append(r)
    best: Cost | None = None
    for cases in per_device.values():
        main_mode = cases[0].mode
        cost = Cost(wall=wall, cases=0.0)
        for r in cases:
            spent = r.cost_s or {}
            if r.mode != main_mode:
                cost.reruns += r.duration_s
                continue
            for name, seconds in spent.items():
                if name == BOOKKEEPING:
                    cost.bookkeeping += seconds
                else:
                    cost.detectors[name] = cost.detectors.get(name, 0.0) + seconds
            cost.cases += max(0.0, r.duration_s - sum(spent.values()))
        if best is None or cost.cases + cost.reruns > best.cases + best.reruns:
            best = cost
    return best if best is not None else Cost(wall=wall, cases=0.0)


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
