"""Tables of `gpucheck run --distributed` run folders: every case per rank, and each group
finding with its kind, the ranks at fault, the time to finding and the NVML orphan check.

Usage: python benchmarks/dist_summary.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folders: list[str]) -> int:
    for folder in folders:
        path = Path(folder) / "results.jsonl"
        if not path.exists():
            print(f"{folder}: no results.jsonl")
            continue
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        cases = [r for r in records if r.get("record") == "case"]
        print(f"== {folder}: {len(cases)} case records")
        for r in cases:
            if "distributed" in r:
                continue
            kinds = ",".join(f["kind"] for f in r["findings"]) or "-"
            print(f"  {r['device']:<14} {r['status']:<8} {r['duration_s']:>8.2f} s  "
                  f"{r['case'].split('::')[-1]:<48} {kinds}")
        groups = [r for r in cases if "distributed" in r]
        if groups:
            print(f"  {'case':<44} {'kind':<20} {'at fault':<9} {'waiting':<8} "
                  f"{'found after':>11}  orphans")
        for r in groups:
            d = r["distributed"]
            evidence = r["findings"][0].get("evidence") or ""
            orphan = next((line for line in evidence.splitlines()
                           if line.startswith("NVML orphan check")), "NVML orphan check: -")
            print(f"  {r['case'].split('::')[-1]:<44} {d['kind']:<20} "
                  f"{','.join(map(str, d['cause_ranks'])):<9} "
                  f"{','.join(map(str, d['waiting_ranks'])) or '-':<8} "
                  f"{d['time_to_finding_s']:>9.2f} s  {orphan.split(': ', 1)[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
