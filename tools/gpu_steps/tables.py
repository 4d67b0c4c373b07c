"""The tables `tools/gpu` prints from run folders (no GPU needed: they read results.jsonl).

    python tools/gpu_steps/tables.py matrix RUN           the self-test's defect x detector rows
    python tools/gpu_steps/tables.py counts RUN [RUN ...] cases per device, suite, status; findings
    python tools/gpu_steps/tables.py cost DIR             detectors on / off (the cost step's runs)
    python tools/gpu_steps/tables.py dist RUN [RUN ...]   distributed runs: cases per rank, and
                                                          each group finding with its ranks, time
                                                          to finding and NVML orphan check

Each ends with one summary line (the step's note). Exit 1 when a run folder has no results.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any


def records(run: Path) -> list[dict[str, Any]]:
    """Every record of ``run``/results.jsonl; a torn last line (a run cut mid-write) is skipped."""
    path = run / "results.jsonl"
    out = []
    if path.exists():
        for line in path.open():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def matrix(run: Path) -> int:
    from gpucheck import selftest

    if not (run / "results.jsonl").exists():
        print(f"{run}: no results.jsonl")
        return 1
    cases, devices = selftest.read_run(run)
    rows, false = selftest.matrix(cases, devices)
    print(f"{run}: {'defect':60} {'kind':18} result   detail")
    for r in rows:
        print(f"  {r.defect.name[:60]:60} {r.defect.kind:18} {r.status:8} {r.detail[:110]}")
    for f in false:
        print(f"  FALSE POSITIVE {f['case']} {f['mode']}: {f['kind']}: {f['message'][:160]}")
    end = [r for r in records(run) if r.get("record") == "end"]
    print(f"  ended: {end[-1] if end else 'no end record'}")
    zoo = selftest.zoo_matrix(cases, devices)
    for z in zoo:
        found, could = z.recall
        why = "; ".join(
            [
                *(f"missed {e.kind} {e.op or ''}: {w}" for e, w in z.missed),
                *(f"not run {e.kind}: {w}" for e, w in z.not_run),
            ]
        )
        print(
            f"  zoo {z.row.name[:58]:58} recall {found}/{could} unexpected "
            f"{len(z.unexpected)} {why[:150]}"
        )
        for u in z.unexpected:
            print(
                f"    UNEXPECTED {u.get('device')} {u.get('case')} {u.get('kind')}: "
                f"{str(u.get('message'))[:160]}"
            )
    total = [sum(z.recall[i] for z in zoo) for i in (0, 1)]
    by = Counter(r.status for r in rows)  # last: the step's note
    print(
        f"rows {len(rows)}: {by['found']} found, {by['missed']} missed, {by['not run']} not run;"
        f" false positives on clean cases: {len(false)}; zoo {len(zoo)} rows: recall "
        f"{total[0]}/{total[1]}, unexpected findings {sum(len(z.unexpected) for z in zoo)}"
    )
    return 0


def counts(*runs: Path) -> int:
    rc = 0
    for run in runs:
        recs = records(run)
        cases = [r for r in recs if r.get("record") == "case"]
        if not cases:
            print(f"{run}: no case records")
            rc = 1
            continue
        print(f"{run}: case records per device, suite, mode, status")
        by = Counter((r["device"], r["suite"], r["mode"], r["status"]) for r in cases)
        for k, v in sorted(by.items()):
            print(f"  {' '.join(k)}: {v}")
        found = [
            (r["device"], r["case"], f)
            for r in recs
            if r.get("record") in ("case", "diagnosis")
            for f in r.get("findings", [])
        ]
        for dev, case, f in found[:25]:
            print(
                f"   {dev} {case[:70]}: {f['kind']}/{f['severity']} "
                f"{f.get('op') or f.get('kernel') or ''}: {f['message'][:150]}"
            )
        by_status = Counter(r["status"] for r in cases)
        status = ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
        print(f"{run.name}: {len(cases)} case records ({status}), {len(found)} findings")
    return rc


def cost(work: Path) -> int:
    """The cost step's four runs (on_a, off_a, on_b, off_b): each setting once on each card."""
    runs: dict[str, dict[str, float]] = {}
    suite_of: dict[str, str] = {}
    for lab in ("on_a", "off_a", "on_b", "off_b"):
        runs[lab] = {}
        for r in records(work / f"cost_{lab}"):
            if r.get("record") == "case" and r.get("status") == "passed":
                runs[lab][r["case"]] = r["duration_s"]
                suite_of[r["case"]] = r["suite"]
    common = set.intersection(*(set(v) for v in runs.values())) if all(runs.values()) else set()
    print(f"cost: {len(common)} cases passed in all four runs (blocking+nvml)")
    if not common:
        return 1

    def both(a: str, b: str, cs: Any) -> float:
        return sum(runs[a][c] + runs[b][c] for c in cs)

    for lab, v in runs.items():
        print(f"  {lab:6} sum of case time {sum(v[c] for c in common):8.2f} s")
    ratios = [both("on_a", "on_b", [c]) / max(both("off_a", "off_b", [c]), 1e-9) for c in common]
    for suite in sorted({suite_of[c] for c in common}):
        cs = [c for c in common if suite_of[c] == suite]
        on, off = both("on_a", "on_b", cs), both("off_a", "off_b", cs)
        print(
            f"  {suite:8} {len(cs):4} cases  on {on / 2:7.2f} s  off {off / 2:7.2f} s"
            f"  ratio {on / off:.3f}"
        )
    total = both("on_a", "on_b", common) / both("off_a", "off_b", common)
    print(
        f"detectors on / off: {total:.3f} (sum of case time of {len(common)} cases), "
        f"per-case median {statistics.median(ratios):.3f}"
    )
    spent: Counter[str] = Counter()
    for lab in ("on_a", "on_b"):
        for r in records(work / f"cost_{lab}"):
            if r.get("record") == "case":
                spent.update({k: v / 2 for k, v in (r.get("cost_s") or {}).items()})
    print(
        "cost_s of the detectors on (mean of the two runs): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in spent.most_common(8))
    )
    return 0


def dist(*runs: Path) -> int:
    rc = 0
    for run in runs:
        cases = [r for r in records(run) if r.get("record") == "case"]
        if not cases:
            print(f"{run}: no case records")
            rc = 1
            continue
        print(f"== {run}: {len(cases)} case records")
        for r in cases:
            if "distributed" in r:
                continue
            kinds = ",".join(f["kind"] for f in r["findings"]) or "-"
            print(
                f"  {r['device']:<14} {r['status']:<8} {r['duration_s']:>8.2f} s  "
                f"{r['case'].split('::')[-1]:<48} {kinds}"
            )
        groups = [r for r in cases if "distributed" in r]
        if groups:
            print(
                f"  {'case':<44} {'kind':<20} {'at fault':<9} {'waiting':<8} "
                f"{'found after':>11}  orphans"
            )
        for r in groups:
            d = r["distributed"]
            evidence = r["findings"][0].get("evidence") or ""
            orphan = next(
                (line for line in evidence.splitlines() if line.startswith("NVML orphan check")),
                "NVML orphan check: -",
            )
            print(
                f"  {r['case'].split('::')[-1]:<44} {d['kind']:<20} "
                f"{','.join(map(str, d['cause_ranks'])):<9} "
                f"{','.join(map(str, d['waiting_ranks'])) or '-':<8} "
                f"{d['time_to_finding_s']:>9.2f} s  {orphan.split(': ', 1)[-1]}"
            )
    return rc


COMMANDS: dict[str, Callable[..., int]] = {
    "matrix": matrix,
    "counts": counts,
    "cost": cost,
    "dist": dist,
}


def main(argv: list[str]) -> int:
    one = ("matrix", "cost")  # one folder each
    if len(argv) < 2 or argv[0] not in COMMANDS or (argv[0] in one and len(argv) != 2):
        print(__doc__)
        return 2
    return COMMANDS[argv[0]](*map(Path, argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
