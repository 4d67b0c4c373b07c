"""The run-level diagnosis (pipeline.diagnose) adding the memory detectors' findings to a
run's results.jsonl."""

from __future__ import annotations

import json

from memkit import TORCH20_OOM, GiB, failed, sized

from gpucheck.controller import pipeline
from gpucheck.model import results
from gpucheck.model.runlog import RunLog


def test_diagnose_adds_memory_findings(tmp_path):
    path = tmp_path / "results.jsonl"
    results.append(
        path,
        {
            "schema": results.SCHEMA_ID,
            "record": "run",
            "run_id": "r1",
            "devices": [
                {"device": "cuda:0", "uuid": "GPU-a", "name": "H200", "memory_total": 150 * GiB}
            ],
        },
    )
    for r in [failed(TORCH20_OOM), *(sized(n, 4 * n * n) for n in (1024, 2048, 4096))]:
        results.append(path, {**r.to_json(), "run_id": "r1"})
    made = pipeline.diagnose(RunLog(path), RunLog(tmp_path / "rerun.jsonl"), "r1")
    kinds = sorted(d.findings[0].kind for d in made)
    assert kinds == ["memory-growth", "oom-anomaly"]
    assert all(d.mode == "blocking+nvml" for d in made)
    assert json.loads(path.read_text().splitlines()[-1])["record"] == "diagnosis"
