"""The controller's own cost per device: what one ``gpucheck run`` process spends watching N
workers at once, for the plan of a run on eight GPUs.

    python benchmarks/controller_cost.py OUT_DIR [--workers 1 2 4 8] [--cases 200]
        [--case-ms 20] [--rounds 3]

Each worker runs the same suite of ``--cases`` tests that each sleep ``--case-ms`` (a case that
waits on its GPU: no CPU of its own, so N workers on a small CPU machine run side by side as on
N GPUs), under the controller's own watch: :class:`gpucheck.controller.harness.Harness`
(state files, logs, exit codes, a poll every ``POLL_S``) with the run's progress reading
every record (:class:`gpucheck.controller.progress.Progress`, quiet), the workers labelled
like devices and without a GPU. The controller's CPU time (its process alone, not the
workers': ``getrusage(RUSAGE_SELF)``) over its wall time is the share of one core it takes;
divided by workers and by cases, what one more device and one more case cost it. The table is
printed and written to OUT_DIR/controller_cost.json with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from gpucheck.controller.config import make_console
from gpucheck.controller.harness import POLL_S, Harness
from gpucheck.controller.progress import Progress
from gpucheck.controller.spawning import WorkerSpec
from gpucheck.model import results
from gpucheck.model.runlog import RunLog


def suite(folder: Path, cases: int, case_ms: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_wait.py").write_text(
        "import time\n\nimport pytest\n\n\n"
        f"@pytest.mark.parametrize('i', range({cases}))\n"
        f"def test_wait(i):\n    time.sleep({case_ms / 1000})\n"
    )
    return folder


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one(out: Path, workers: int, suite_dir: Path) -> dict[str, Any]:
    out.mkdir(parents=True)
    path = out / "results.jsonl"
    results.append(path, {"schema": results.SCHEMA_ID, "record": "run", "run_id": "cost"})
    specs = [
        WorkerSpec(
            f"cpu{i}", None, None, {"s": suite_dir}, "blocking", env={"CUDA_VISIBLE_DEVICES": ""}
        )
        for i in range(workers)
    ]
    log = RunLog(path)
    with Progress(lambda: make_console(), quiet=True) as progress:
        progress.follow(log)
        harness = Harness(specs, out, log, "cost", timeout=600, on_update=progress.update)
        cpu0, t0 = cpu_seconds(), time.monotonic()
        harness.run()
        wall, cpu = time.monotonic() - t0, cpu_seconds() - cpu0
    log.refresh()
    cases = sum(1 for r in log.cases if r.status == "passed")
    return {"workers": workers, "wall_s": wall, "controller_cpu_s": cpu, "cases": cases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--case-ms", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    suite_dir = suite(args.out / "suite", args.cases, args.case_ms)
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in args.workers}
    one(args.out / "warm-up", 1, suite_dir)  # what the first watch imports, not in a round
    for rnd in range(args.rounds):
        for n in args.workers:
            run = one(args.out / f"n{n}.{rnd}", n, suite_dir)
            runs[n].append(run)
            print(
                f"round {rnd}: {n} worker(s): {run['wall_s']:.2f} s, controller CPU "
                f"{run['controller_cpu_s']:.3f} s, {run['cases']} cases",
                flush=True,
            )
    rows = []
    for n, rs in runs.items():
        wall = statistics.median(r["wall_s"] for r in rs)
        cpu = statistics.median(r["controller_cpu_s"] for r in rs)
        cases = statistics.median(r["cases"] for r in rs)
        rows.append(
            {
                "workers": n,
                "wall_s": wall,
                "controller_cpu_s": cpu,
                "core_share": cpu / wall,
                "cpu_per_worker_s": cpu / n,
                "cpu_per_case_ms": 1000 * cpu / cases if cases else None,
                "cases": cases,
            }
        )
    result = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "poll_s": POLL_S,
        "cases_per_worker": args.cases,
        "case_ms": args.case_ms,
        "rounds": args.rounds,
        "runs": runs,
        "medians": rows,
    }
    (args.out / "controller_cost.json").write_text(json.dumps(result, indent=1))
    print(
        f"\n{result['machine']}, {args.cases} cases of {args.case_ms} ms a worker, "
        f"{args.rounds} rounds, medians\n\n"
        "| workers | wall s | controller CPU s | share of a core | CPU s a worker "
        "| CPU ms a case |\n|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['workers']} | {r['wall_s']:.2f} | {r['controller_cpu_s']:.3f} | "
            f"{100 * r['core_share']:.1f} % | {r['cpu_per_worker_s']:.3f} | "
            f"{r['cpu_per_case_ms']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
