"""Time to verdict: the same suites as plain pytest and through ``gpucheck run``, side by side.

    python benchmarks/harness_cost.py OUT_DIR [--rounds N] [--suite NAME_OR_PATH ...]
        [--cpu-only] [--only VARIANT ...] [-- PYTEST_ARGS]

Each round runs every variant once (the ``-all`` ones where more than one GPU is visible),
one after another, in an order rotated round by round
(so that a warmer disk or a clock ramp favours none), all in this one process tree, after
one ``pytest --collect-only`` of the suites (a fresh machine reads torch and the suites from
disk once, not in the first variant's time):

- ``pytest``: ``python -m pytest SUITES`` with gpucheck's plugin loaded (it always is, by its
  entry point) and ``GPUCHECK_DISABLE_DETECTORS=all``, on the first visible GPU
  (``GPUCHECK_DEVICES=0``, every GPU still visible: the cases ``gpucheck run --device 0``
  runs; left alone, plain pytest runs every case once per visible GPU);
- ``pytest-clb``: the same under ``CUDA_LAUNCH_BLOCKING=1`` (how gpucheck runs a case);
- ``gpucheck``: ``gpucheck run`` on the first visible device (``--cpu-only`` without a GPU),
  the default modes, every detector on;
- ``gpucheck-blocking``: the same with the mode ``blocking`` alone (no NVML sampling: its
  share of the cost);
- ``gpucheck-nodet``: the same with every detector off (what the harness costs by itself);
- ``gpucheck-all``: ``gpucheck run --all-devices`` (every detector): N GPUs against one, the
  same cases on each (its row also gives its wall over ``gpucheck``'s);
- ``pytest-clb-all``: ``pytest-clb`` on every visible GPU at once, one process each (its
  own ``CUDA_VISIBLE_DEVICES``, and the share of the CPUs ``gpucheck run`` gives each of its
  workers: ``OMP_NUM_THREADS``), the wall of the slowest: how the machine itself scales, to
  set ``gpucheck-all`` against.

The table gives the median wall time of each, the ratio the target is set on (gpucheck over
``pytest-clb`` on a GPU, over ``pytest`` without one) for the medians and for each round (a
round's variants run back to back: a pair), with the median of those, and where gpucheck's
extra time went, from its own records (medians over rounds): before the first case
(start-up), inside the cases (each detector's ``cost_s``, the worker's bookkeeping), between
and after the cases (re-run passes, the report); then each case's duration in gpucheck's
records against pytest's own (its JUnit XML), medians over rounds: their sums, the extra by
suite split into what the records count (``cost_s``) and the rest, beside pytest's own sum of
those cases in each round (a rest within that spread is the baseline's noise, not gpucheck),
and the cases that cost the most over plain pytest, the same way.
Everything measured is written to OUT_DIR/harness_cost.json, after every round (a run cut
short keeps the rounds it finished).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from gpucheck.controller.spawning import thread_share
from gpucheck.model.contract import DEVICES_ENV

VARIANTS = (
    "pytest",
    "pytest-clb",
    "pytest-clb-all",
    "gpucheck",
    "gpucheck-blocking",
    "gpucheck-nodet",
    "gpucheck-all",
)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--suite", action="append", default=[])
    ap.add_argument("--cpu-only", action="store_true")
    ap.add_argument("--only", action="append", choices=VARIANTS, default=[])
    return ap.parse_args(argv), extra


def suite_paths(names: list[str]) -> list[Path]:
    """The folders ``gpucheck run --suite`` would run, for plain pytest."""
    from gpucheck.controller.suites import available

    found = available()
    return [found[n] if n in found else Path(n).resolve() for n in names]


def command(variant: str, args: argparse.Namespace, extra: list[str], out: Path) -> list[str]:
    if variant.startswith("pytest"):
        paths = [str(p) for p in suite_paths(args.suite)]
        junit = [] if variant.endswith("-all") else [f"--junitxml={out}.junit.xml"]
        return [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *junit, *paths, *extra
        ]  # fmt: skip
    where = (
        ["--cpu-only"]
        if args.cpu_only
        else ["--all-devices"]
        if variant == "gpucheck-all"
        else ["--device", "0"]
    )
    suites = [x for s in args.suite for x in ("--suite", s)]
    modes = ["--mode", "blocking"] if variant == "gpucheck-blocking" else []
    tail = ["--", *extra] if extra else []
    return [
        *GPUCHECK, "run", "--quiet", *where, *modes, *suites, "--out", str(out), *tail,
    ]  # fmt: skip


#: the ``gpucheck`` command as users type it: the script installed beside this Python (else
#: ``python -m gpucheck``, the same entry point)
_SCRIPT = Path(sys.executable).parent / "gpucheck"
GPUCHECK = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "gpucheck"]


def environment(variant: str, gpu: bool) -> dict[str, str]:
    """A variant's environment; ``gpu``: a run on GPUs (the one-device pytest variants then
    target the device ``gpucheck run --device 0`` does)."""
    env = dict(os.environ)
    env.pop("GPUCHECK_DISABLE_DETECTORS", None)
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    env.pop(DEVICES_ENV, None)
    if gpu and variant in ("pytest", "pytest-clb"):
        env[DEVICES_ENV] = "0"
    if variant in ("pytest", "pytest-clb", "pytest-clb-all", "gpucheck-nodet"):
        env["GPUCHECK_DISABLE_DETECTORS"] = "all"
    if variant in ("pytest-clb", "pytest-clb-all"):
        env["CUDA_LAUNCH_BLOCKING"] = "1"
    return env


def visible_gpus() -> list[str]:
    """What ``CUDA_VISIBLE_DEVICES`` names each visible GPU by (its index when unset)."""
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is not None:
        return [x.strip() for x in named.split(",") if x.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def run_variant(cmd: list[str], variant: str, log_stem: Path, gpu: bool) -> int:
    """One variant's run (``pytest-clb-all``: one process per visible GPU, all at once, each
    with its own log and share of the CPUs); its exit code (the worst of them)."""
    if variant != "pytest-clb-all":
        with open(f"{log_stem}.log", "w") as log:
            env = environment(variant, gpu)
            return subprocess.run(cmd, env=env, stdout=log, stderr=log).returncode
    gpus = visible_gpus()
    with contextlib.ExitStack() as logs:
        procs = []
        for g in gpus:
            log = logs.enter_context(open(f"{log_stem}.gpu{g}.log", "w"))
            env = {
                **environment(variant, gpu),
                **thread_share(len(gpus)),
                "CUDA_VISIBLE_DEVICES": g,
            }
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=log))
        codes = [proc.wait() for proc in procs]
    return max(codes, default=1)


def stamp(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines() if x]


def passes(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The case records that ran of the first pass (its mode), and those of later passes."""
    cases = [r for r in records if r.get("record") == "case" and r.get("started_at")]
    first_mode = cases[0]["mode"] if cases else None
    return (
        [r for r in cases if r["mode"] == first_mode],
        [r for r in cases if r["mode"] != first_mode],
    )


def breakdown(run_dir: Path, launched: float, ended: float) -> dict[str, Any]:
    """Where one gpucheck run's wall time went, from its results.jsonl (seconds). With
    several devices (they run at once) the case time, the time between cases and the
    detectors' are the busiest device's; the first and last case are any device's."""
    records = read_records(run_dir)
    header = next(r for r in records if r.get("record") == "run")
    end: dict[str, Any] = next((r for r in reversed(records) if r.get("record") == "end"), {})
    main, again = passes(records)
    by_device: dict[str, list[dict[str, Any]]] = {}
    for r in main:
        by_device.setdefault(r["device"], []).append(r)
    busiest = max(by_device.values(), key=lambda rs: sum(r["duration_s"] for r in rs), default=[])
    starts = [stamp(r["started_at"]) or 0.0 for r in main]
    ends = [(stamp(r["started_at"]) or 0.0) + r["duration_s"] for r in main]
    own_starts = [stamp(r["started_at"]) or 0.0 for r in busiest]
    own_ends = [(stamp(r["started_at"]) or 0.0) + r["duration_s"] for r in busiest]
    costs: dict[str, float] = {}
    for r in busiest:
        for name, s in (r.get("cost_s") or {}).items():
            costs[name] = costs.get(name, 0.0) + s
    record = costs.pop("record", 0.0)
    finished = stamp(end.get("finished_at")) or ended
    case_time = sum(r["duration_s"] for r in busiest)
    return {
        "cases": len(main),
        "devices": len(by_device),
        "to_header": (stamp(header.get("started_at")) or launched) - launched,
        "to_first_case": (min(starts) - launched) if starts else 0.0,
        "case_time": case_time,
        "detectors": costs,
        "detectors_total": sum(costs.values()),
        "record": record,
        "between_cases": (max(own_ends) - min(own_starts) - case_time) if busiest else 0.0,
        "rerun_passes": sum(r["duration_s"] for r in again),
        "after_last_case": finished - max(ends) if ends else 0.0,
        "after_end_record": ended - finished,
    }


def junit_durations(path: Path) -> dict[str, float]:
    """Each case's seconds in pytest's JUnit XML (setup, call and teardown), by the id gpucheck
    gives it (``file.py::Class::test[params]``, the file relative to its suite's folder: the
    XML names the module by its dotted path, so the ids are matched on their last parts)."""
    import xml.etree.ElementTree as ET

    if not path.exists():
        return {}
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        out[f"{case.get('classname')}::{case.get('name')}"] = float(case.get("time") or 0.0)
    return out


def same_case(junit_id: str, case: str) -> bool:
    classname, _, name = junit_id.partition("::")
    file, *classes, func = case.split("::")
    stem = file.rsplit("/", 1)[-1].removesuffix(".py")
    want = [stem, *classes]
    return name == func and classname.split(".")[-len(want) :] == want


def per_case(result_runs: list[Path], junit_runs: list[Path], top: int = 15) -> dict[str, Any]:
    """Every case of one gpucheck variant against plain pytest's duration of it (medians over
    rounds, seconds): their sums, the median extra a case, the cases with the most extra; of
    each case's extra, what its record counts (``counted_s``: its ``cost_s``, the detectors'
    and the worker's bookkeeping) and the rest (``uncounted_s``); the same by suite, with
    pytest's own sum of the suite's cases in each round (``pytest_rounds_s``: how far the
    baseline itself moves from one round to the next)."""
    ours: dict[str, list[tuple[float, float]]] = {}
    for run_dir in result_runs:
        if not (run_dir / "results.jsonl").is_file():
            continue  # a run that wrote no records (it failed to start): nothing to match
        for r in passes(read_records(run_dir))[0]:
            counted = sum((r.get("cost_s") or {}).values())
            ours.setdefault(f"{r['suite']}/{r['case']}", []).append((r["duration_s"], counted))
    rounds = [junit_durations(path) for path in junit_runs]
    theirs: dict[str, list[float]] = {}
    for durations in rounds:
        for jid, t in durations.items():
            theirs.setdefault(jid, []).append(t)
    by_name: dict[str, list[str]] = {}
    for jid in theirs:
        by_name.setdefault(jid.partition("::")[2], []).append(jid)
    rows: list[dict[str, Any]] = []
    for key, runs in ours.items():
        case = key.partition("/")[2]
        match = [j for j in by_name.get(case.rsplit("::", 1)[-1], []) if same_case(j, case)]
        if len(match) == 1:
            mine = statistics.median(d for d, _ in runs)
            counted = statistics.median(c for _, c in runs)
            base = statistics.median(theirs[match[0]])
            rows.append(
                {
                    "case": key,
                    "junit": match[0],
                    "gpucheck_s": mine,
                    "pytest_s": base,
                    "extra_s": mine - base,
                    "counted_s": counted,
                    "uncounted_s": mine - base - counted,
                    "pytest_range_s": [min(theirs[match[0]]), max(theirs[match[0]])],
                }
            )
    rows.sort(key=lambda r: -r["extra_s"])
    return {
        "matched": len(rows),
        "cases": len(ours),
        **_sums(rows),
        "median_extra_s": statistics.median(r["extra_s"] for r in rows) if rows else 0.0,
        "suites": by_suite(rows, rounds),
        "top": rows[:top],
    }


def _sums(rows: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("gpucheck_s", "pytest_s", "extra_s", "counted_s", "uncounted_s")
    return {k: sum(r[k] for r in rows) for k in keys}


def by_suite(rows: list[dict[str, Any]], rounds: list[dict[str, float]]) -> dict[str, Any]:
    """The matched cases' sums by suite, and pytest's sum of them in each round."""
    suites: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        suites.setdefault(r["case"].partition("/")[0], []).append(r)
    return {
        name: {
            "cases": len(mine),
            **_sums(mine),
            "pytest_rounds_s": [
                sum(d[r["junit"]] for r in mine if r["junit"] in d) for d in rounds if d
            ],
        }
        for name, mine in sorted(suites.items())
    }


def main(argv: list[str]) -> int:
    args, extra = parse(argv)
    trivial = str(Path(__file__).resolve().parent / "trivial")
    args.suite = args.suite or ([trivial] if args.cpu_only else ["ssim", "knn", "splat"])
    several = not args.cpu_only and len(visible_gpus()) > 1
    variants = args.only or [v for v in VARIANTS if several or not v.endswith("-all")]
    if args.cpu_only and any(v.endswith("-all") for v in variants):
        sys.exit("--cpu-only: the -all variants need GPUs")
    args.out.mkdir(parents=True, exist_ok=True)
    walls: dict[str, list[float]] = {v: [] for v in variants}
    codes: dict[str, list[int]] = {v: [] for v in variants}
    parts: dict[str, list[dict[str, Any]]] = {v: [] for v in variants if v.startswith("gpu")}
    # a fresh machine reads torch and the suites from disk once: not in the first variant's time
    warm = [*command("pytest", args, extra, args.out), "--collect-only"]
    subprocess.run(
        warm,
        env=environment("pytest", not args.cpu_only),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    result: dict[str, Any] = {}
    for rnd in range(args.rounds):
        order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
        for v in order:
            out = args.out / f"{v}.{rnd}"
            cmd = command(v, args, extra, out)
            t0 = time.time()
            code = run_variant(cmd, v, args.out / f"{v}.{rnd}", not args.cpu_only)
            t1 = time.time()
            walls[v].append(t1 - t0)
            codes[v].append(code)
            if v in parts and (out / "results.jsonl").exists():
                parts[v].append(breakdown(out, t0, t1))
            print(f"round {rnd}: {v}: {t1 - t0:.2f} s, exit {code}", flush=True)
        # after every round: a run cut short (a machine's time limit) keeps the rounds it ran
        result = summary(args, extra, variants, walls, codes, parts, rnd + 1)
        (args.out / "harness_cost.json").write_text(json.dumps(result, indent=1))
    print(table(result, args.cpu_only))
    return 0 if all(c == 0 for cs in codes.values() for c in cs) else 1


def summary(
    args: argparse.Namespace,
    extra: list[str],
    variants: list[str],
    walls: dict[str, list[float]],
    codes: dict[str, list[int]],
    parts: dict[str, list[dict[str, Any]]],
    rounds: int,
) -> dict[str, Any]:
    """What the first ``rounds`` rounds measured: medians, each round's ratio to the base
    variant (the rounds are pairs: their ratios' median is the other statistic), the
    breakdowns, each case against pytest's."""
    med = {v: statistics.median(w) for v, w in walls.items()}
    base = "pytest" if args.cpu_only else "pytest-clb"
    ratios = {
        v: [w / b for w, b in zip(walls[v], walls[base], strict=True)]
        for v in variants
        if base in walls and v != base
    }
    result: dict[str, Any] = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": device_name(args.cpu_only),
        "suites": args.suite,
        "pytest_args": extra,
        "rounds": rounds,
        "walls": walls,
        "exit_codes": codes,
        "median_wall": med,
        "round_ratios": ratios,
        "breakdown": parts,
    }
    if base in variants:  # each one-device gpucheck variant's cases against pytest's
        result["per_case"] = {
            v: per_case(
                [args.out / f"{v}.{r}" for r in range(rounds)],
                [args.out / f"{base}.{r}.junit.xml" for r in range(rounds)],
            )
            for v in variants
            if v.startswith("gpucheck") and not v.endswith("-all")
        }
    return result


def suite_lines(name: str, suites: dict[str, Any], base: str) -> list[str]:
    """The table's lines of the extra by suite: what the records count (``cost_s``) and the
    rest, beside how far pytest's own sum of those cases moved over the rounds."""
    lines = [
        "",
        f"{name}'s extra by suite: counted, its records' cost_s (detectors, bookkeeping); "
        f"uncounted, the rest (within the spread of {base}'s own sums over the rounds, it is "
        "noise):",
        "",
        f"| suite | cases | {name} s | {base} s | extra s | counted s | uncounted s | "
        f"{base} each round s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for suite, x in suites.items():
        each = ", ".join(f"{t:.2f}" for t in x["pytest_rounds_s"])
        lines.append(
            f"| {suite} | {x['cases']} | {x['gpucheck_s']:.2f} | {x['pytest_s']:.2f} | "
            f"{x['extra_s']:.2f} | {x['counted_s']:.2f} | {x['uncounted_s']:.2f} | {each} |"
        )
    return lines


def device_name(cpu_only: bool) -> str:
    if cpu_only:
        return f"CPU ({os.cpu_count()} cores)"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


def _median_part(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs) if runs else 0.0


def table(result: dict[str, Any], cpu_only: bool) -> str:
    med = result["median_wall"]
    base = "pytest" if cpu_only else "pytest-clb"
    lines = [
        f"\n{result['device']}, suites {', '.join(result['suites'])}, "
        f"{result['rounds']} rounds, medians",
        "",
        "| variant | wall s | / " + base + " | each round / " + base + " (median) |",
        "|---|---|---|---|",
    ]
    by_round = result.get("round_ratios") or {}
    for v, w in med.items():
        ratio = f"{w / med[base]:.2f}x" if med.get(base) else ""
        if v == "gpucheck-all" and med.get("gpucheck"):
            ratio += f" ({w / med['gpucheck']:.2f}x of one GPU's gpucheck)"
        rounds = by_round.get(v) or []
        paired = (
            f"{', '.join(f'{r:.2f}' for r in rounds)} ({statistics.median(rounds):.2f}x)"
            if rounds
            else ""
        )
        lines.append(f"| {v} | {w:.2f} | {ratio} | {paired} |")
    runs = result["breakdown"].get("gpucheck", [])
    if runs:
        lines += ["", "| gpucheck, where its time went | s |", "|---|---|"]
        for key in (
            "to_header",
            "to_first_case",
            "case_time",
            "detectors_total",
            "record",
            "between_cases",
            "rerun_passes",
            "after_last_case",
            "after_end_record",
        ):
            lines.append(f"| {key} | {_median_part(runs, key):.2f} |")
        names = sorted({n for r in runs for n in r["detectors"]})
        per = {n: statistics.median(r["detectors"].get(n, 0.0) for r in runs) for n in names}
        for n, s in sorted(per.items(), key=lambda x: -x[1]):
            lines.append(f"| detector {n} | {s:.2f} |")
    by_variant = result.get("per_case") or {}
    if by_variant:
        lines += [
            "",
            f"each case against {base}'s own duration of it (its JUnit XML), medians over rounds:",
            "",
            f"| variant | cases matched | its cases s | {base}'s s | extra s | "
            "median extra a case ms |",
            "|---|---|---|---|---|---|",
        ]
        for v, pc in by_variant.items():
            lines.append(
                f"| {v} | {pc['matched']} of {pc['cases']} | {pc['gpucheck_s']:.2f} | "
                f"{pc['pytest_s']:.2f} | {pc['extra_s']:.2f} | {1000 * pc['median_extra_s']:.1f} |"
            )
    # the costliest cases of the default run (else of the first variant measured)
    name = "gpucheck" if "gpucheck" in by_variant else next(iter(by_variant), None)
    top = by_variant[name] if name else None
    if name and top and top["suites"]:
        lines += suite_lines(name, top["suites"], base)
    if top and top["top"]:
        lines += [
            "",
            f"the cases {name} took longest over {base}:",
            "",
            f"| case | {name} s | {base} s (rounds' range) | extra s | counted s | uncounted s |",
            "|---|---|---|---|---|---|",
        ]
        for r in top["top"]:
            low, high = r["pytest_range_s"]
            lines.append(
                f"| {r['case']} | {r['gpucheck_s']:.3f} | {r['pytest_s']:.3f} "
                f"({low:.3f}-{high:.3f}) | {r['extra_s']:.3f} | {r['counted_s']:.3f} | "
                f"{r['uncounted_s']:.3f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
