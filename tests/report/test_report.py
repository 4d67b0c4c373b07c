"""The reports of a run (report.html, results.json, junit.xml) from real run folders: a run of
the real harness on CPU, a run recorded on a GPU machine (fixtures/run_h200_selftest), runs cut
short, and a synthetic run written with the package's own record writers."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from clirun import gpucheck, start
from report_synth import make_run, real_cpu_run

from gpucheck.model import results
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.report import junit, publish, timeline, write_all

GPU_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "run_h200_selftest"


@pytest.fixture(scope="session")
def cpu_run(tmp_path_factory):
    return real_cpu_run(tmp_path_factory.getbasetemp())


@pytest.fixture
def run_copy(tmp_path, cpu_run):
    dst = tmp_path / "run"
    shutil.copytree(cpu_run, dst)
    for name in ("report.html", "results.json", "junit.xml"):
        (dst / name).unlink(missing_ok=True)
    return dst


class _Page(HTMLParser):
    """Tags, attributes and text of a page (what a browser would fetch, and what it shows)."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: list[tuple[str, str, str]] = []
        self.ids: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            self.attrs.append((tag, k, v or ""))
            if k == "id":
                self.ids.append(v or "")

    def handle_data(self, data):
        self.text.append(data)


def _page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    return page


def test_cpu_run_reports(run_copy):
    done = publish(run_copy)
    paths = done.paths
    assert set(paths) == {"html", "json", "junit"}
    recs = results.cases(run_copy / "results.jsonl")
    doc = json.loads(paths["json"].read_text())
    assert doc["schema"] == "gpucheck.report/1"
    assert doc["run"]["record"] == "run" and doc["state"]["complete"] is True
    s = doc["summary"]
    assert s["verdict"] == "failed"
    assert s["cases"] == len(recs) == len(doc["cases"])
    assert s["by_status"] == {
        "passed": 2,
        "failed": 2,
        "skipped": 2,
        "error": 1,
        "crashed": 1,
        "hung": 1,
    }
    assert set(doc["findings"]) == {"test-failure", "cuda-error", "crash", "hang"}
    crash = doc["findings"]["crash"][0]
    assert doc["cases"][crash["case_index"]]["status"] == "crashed"
    assert doc["matrix"] == [
        {"device": "cpu", "suite": "demo", "worst": "crashed", "counts": s["by_status"]}
    ]
    # junit.xml is the JUnit writer's view of the same records, with the same verdict
    root = ET.parse(paths["junit"]).getroot()
    assert ET.tostring(root) == ET.tostring(junit.to_xml(done.data.cases, done.verdict).getroot())
    page = _page(paths["html"])
    text = " ".join(page.text)
    for r in done.data.cases:
        if r.status not in ("passed", "skipped"):
            assert r.case in text  # every case that did not pass is on the page
    assert "terminate called after throwing an instance of 'thrust::system_error'" in text
    assert "in test_hang" in text  # the hang's stack
    assert "SIGABRT" in text
    # self-contained: nothing to fetch, links only to the worker logs beside it
    for tag, key, value in page.attrs:
        if key in ("src", "href") or (tag == "link"):
            assert not re.match(r"[a-z]+://|//", value), (tag, key, value)
        if key == "href" and not value.startswith("#"):
            assert (run_copy / value).exists(), value
    assert {"matrix", "findings", "timelines", "compare", "cases"} <= set(page.ids)
    assert len(page.ids) == len(set(page.ids))
    assert "default-src 'none'" in paths["html"].read_text()


def test_gpu_run_reports(tmp_path):
    if not GPU_RUN.exists():
        pytest.skip("fixtures/run_h200_selftest not recorded yet")
    run = tmp_path / "run"
    shutil.copytree(GPU_RUN, run)
    paths = write_all(run)
    doc = json.loads(paths["json"].read_text())
    cases = results.cases(GPU_RUN / "results.jsonl")
    assert doc["summary"]["cases"] == len(cases)
    assert doc["timeline"]["samples"] > 0
    text = " ".join(_page(paths["html"]).text)
    findings = [f for r in cases for f in r["findings"]]
    assert findings, "the GPU fixture is meant to hold real findings"
    for f in findings:
        assert f["message"] in text
    for d in doc["run"]["devices"]:
        assert d["uuid"] in text and d["name"] in text


def test_interrupted_run_torn_line_no_header_no_timeline(run_copy):
    lines = (run_copy / "results.jsonl").read_text().splitlines()
    # the header is gone, the last record torn mid-write
    (run_copy / "results.jsonl").write_text("\n".join(lines[1:-1]) + "\n" + lines[-1][:40])
    state = run_copy / "workers" / "cpu.blocking.state.json"
    st = json.loads(state.read_text())
    st.update(case="suites/demo/test_demo.py::test_ok", done=0, total=9)
    state.write_text(json.dumps(st))
    for gen in run_copy.glob("workers/cpu.blocking.[0-9]*"):
        gen.unlink()  # as if the harness died in its first worker
    paths = write_all(run_copy)
    doc = json.loads(paths["json"].read_text())
    assert doc["run"] is None and doc["state"]["complete"] is False
    assert doc["summary"]["cases"] == sum('"record":"case"' in x for x in lines[1:-1])
    assert any("no run header" in p for p in doc["state"]["problems"])
    assert any("could not be read" in p for p in doc["state"]["problems"])
    assert doc["state"]["interrupted"] == [
        "worker cpu.blocking stopped inside suites/demo/test_demo.py::test_ok (0 of 9 cases done)"
    ]
    html = paths["html"].read_text()
    assert "The run did not finish." in html and "no run header" in html


def test_empty_run_folder(tmp_path):
    paths = write_all(tmp_path)
    doc = json.loads(paths["json"].read_text())
    assert doc["summary"]["verdict"] == "nothing-tested"
    assert "NOTHING-TESTED" in paths["html"].read_text()
    root = ET.parse(paths["junit"]).getroot()  # only the verdict's own test case, failing
    assert (root.get("tests"), root.get("errors")) == ("1", "1")


def _case(case, status, findings=(), **kw):
    return CaseRecord(
        run_id="r",
        device=kw.pop("device", "cuda:0"),
        suite="ssim",
        case=case,
        mode="blocking",
        status=status,
        findings=list(findings),
        **kw,
    ).to_json()


def test_unknown_kind_is_rendered_generically(tmp_path):
    f = Finding(
        "wrong-device",
        "error",
        "kernel ran on cuda:0 for inputs on cuda:1",
        op="my_ext.forward",
        hint="add OptionalCUDAGuard(device_of(img1))",
        evidence="other device current: failed: illegal memory access\n"
        "target device current: passed",
    )
    rec = _case("t.py::test_x", "failed", [f])
    rec["findings"][0]["differential"] = {"a field": "no writer writes"}  # left out when read
    results.append(tmp_path / "results.jsonl", rec)
    html = write_all(tmp_path)["html"].read_text()
    assert "Wrong device" in html  # a title made from the kind
    assert "add OptionalCUDAGuard(device_of(img1))" in html and "my_ext.forward" in html
    assert "target device current: passed" in html and "failed: illegal memory access" in html
    assert "no writer writes" not in html


def test_page_escapes_what_the_records_say(tmp_path):
    bad = "</script><script>alert(1)</script><b>"
    results.append(tmp_path / "results.jsonl", _case(f"t.py::test_a[{bad}]", "passed", reason=bad))
    results.append(
        tmp_path / "results.jsonl",
        _case("t.py::test_b", "failed", [Finding("test-failure", "error", bad, evidence=bad)]),
    )
    html = write_all(tmp_path)["html"].read_text()
    assert "<script>alert(1)" not in html
    assert html.count("<script") == 2  # the JSON table and the page's own script


def test_sanitizer_evidence_shows_kernel_and_frames(tmp_path):
    make_run(tmp_path, devices=2, cases=12, hours=0.005)
    html = write_all(tmp_path)["html"].read_text()
    card = html[html.index('id="kind-sanitizer"') :]
    assert "add1" in card and "unguarded_add.py:54" in card and "memcheck" in card
    assert "host frames" in card


def test_timeline_keeps_peaks_and_flags_the_stray_context(tmp_path):
    make_run(tmp_path, devices=3, cases=30, hours=0.1, interval=0.05)  # 7,200 samples
    labels = {f"GPU-{i:08x}-synthetic-0": f"cuda:{i}" for i in range(3)}
    tl = timeline.read(tmp_path / "nvml_timeline.jsonl", labels)
    assert tl is not None and tl.samples == 7200 and len(tl.devices) == 3
    raw = [json.loads(line) for line in (tmp_path / "nvml_timeline.jsonl").read_text().splitlines()]
    for d, dev in enumerate(tl.devices):
        true_peak = max(s["devices"][d]["used"] for s in raw)
        assert dev.used.peak == true_peak  # downsampled by max: the peak survives
        assert len(dev.used.values) <= timeline.BUCKETS
    stray = {pid: devs for pid, devs in tl.pid_devices().items() if len(devs) > 1}
    assert stray and all(devs == ["cuda:0", "cuda:2"] for devs in stray.values())
    paths = write_all(tmp_path)
    html = paths["html"].read_text()
    assert html.count("stray context</span>") == 2  # cuda:0 and cuda:2, not cuda:1
    assert "also on cuda:2" in html and "also on cuda:0" in html
    assert json.loads(paths["json"].read_text())["timeline"]["samples"] == 7200


def test_torn_timeline_is_read(tmp_path):
    make_run(tmp_path, devices=1, cases=5, hours=0.01)
    with open(tmp_path / "nvml_timeline.jsonl", "a") as f:
        f.write('{"t": 17000, "devi')
    doc = json.loads(write_all(tmp_path)["json"].read_text())
    assert doc["timeline"]["samples"] == 720
    assert any("nvml_timeline.jsonl" in p for p in doc["state"]["problems"])


def test_cli_report_exit_codes(cpu_run, tmp_path):
    def report(*args):
        return gpucheck("report", *args, timeout=120)

    run = tmp_path / "run"
    shutil.copytree(cpu_run, run)
    out = tmp_path / "elsewhere" / "page.html"
    proc = report(str(run), "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("failed: ") and out.exists()
    assert 'href="../run/workers/' in out.read_text()  # links still reach the logs
    clean = tmp_path / "clean"
    clean.mkdir()
    results.append(clean / "results.jsonl", _case("t.py::t", "passed"))
    assert report(str(clean)).returncode == 0
    proc = report(str(tmp_path / "elsewhere"))
    assert proc.returncode == 2 and "not a gpucheck run folder" in proc.stderr


def test_report_after_the_harness_itself_was_killed(tmp_path):
    """SIGKILL of `gpucheck run` mid-case: no junit.xml, no end of run, a worker still inside
    a case. The report is made from what was recorded and says where the run stopped."""
    import contextlib
    import os
    import signal
    import time

    suite = tmp_path / "suite" / "demo"
    suite.mkdir(parents=True)
    suite.joinpath("test_demo.py").write_text(
        "import time\n\ndef test_ok():\n    pass\n\ndef test_fail():\n    assert 1 == 2\n\n"
        "def test_stuck():\n    time.sleep(600)\n\ndef test_never():\n    pass\n"
    )
    out = tmp_path / "out"
    proc = start(
        "run",
        "--cpu-only",
        "--quiet",
        "--suite",
        str(suite),
        "--timeout",
        "300",
        "--out",
        str(out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state = out / "workers" / "cpu.blocking.state.json"
    worker_pid = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            st = json.loads(state.read_text()) if state.exists() else {}
            if str(st.get("case", "")).endswith("test_stuck"):
                worker_pid = int(st["pid"])
                break
            time.sleep(0.2)
        assert worker_pid, "the worker never reached test_stuck"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        if worker_pid:  # the worker runs in its own session: it outlives the harness
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker_pid, signal.SIGKILL)
    assert not (out / "junit.xml").exists()
    paths = write_all(out)
    doc = json.loads(paths["json"].read_text())
    assert doc["summary"]["by_status"] == {"passed": 1, "failed": 1}
    assert doc["state"]["complete"] is False
    assert doc["state"]["interrupted"] == [
        "worker cpu.blocking stopped inside test_demo.py::test_stuck (2 of 4 cases done)"
    ]
    assert ET.parse(paths["junit"]).getroot().get("tests") == "2"
    assert doc["summary"]["verdict"] == "failed"  # test_fail: a finding outranks the stop
    assert "stopped inside test_demo.py::test_stuck" in paths["html"].read_text()


def test_lint_and_benchmark_records_become_tables(tmp_path):
    results.append(tmp_path / "results.jsonl", _case("t.py::t", "passed"))
    results.append(
        tmp_path / "results.jsonl",
        {
            "schema": results.SCHEMA_ID,
            "record": "lint",
            "run_id": "r",
            "checkpoint": "point_cloud.ply",
            "field": "scale_0",
            "verdict": "activated twice",
            "evidence": "all 120,000 scales positive, median 0.012",
        },
    )
    (tmp_path / "benchmarks.jsonl").write_text(
        json.dumps(
            {"op": "fused_ssim", "device": "cuda:0", "shape": "5x3x1080x1920", "forward_ms": 0.222}
        )
        + "\n"
    )
    paths = write_all(tmp_path)
    html = paths["html"].read_text()
    assert "Checkpoint lint" in html and "activated twice" in html
    assert "Benchmarks" in html and "5x3x1080x1920" in html
    extras = json.loads(paths["json"].read_text())["extras"]
    assert set(extras) == {"lint", "benchmarks"}


def test_the_poisoned_device_is_not_a_stray_context(tmp_path):
    """The 2-GPU example run: every worker of the other-device-current passes holds a context
    on the device the harness made current (by design); none is flagged. Without the state
    files that say which worker a pid is, every process on two GPUs is flagged."""
    from gpucheck.report import plots, rundata

    example = Path(__file__).parents[1] / "fixtures" / "run_h200x2_selftest"
    run = tmp_path / "example"
    shutil.copytree(example, run)
    data = rundata.load(run)
    assert data.header is not None and data.timeline is not None
    both = [pid for pid, devs in data.timeline.pid_devices().items() if len(devs) > 1]
    meant = plots.expected_devices(data)
    assert both and all(meant[int(pid)] == {"cuda:0", "cuda:1"} for pid in both)
    assert not any(p["stray"] for p in plots.plots(data))
    for state in (run / "workers").glob("*.state.json"):
        state.unlink()
    assert all(p["stray"] for p in plots.plots(rundata.load(run)))


def test_results_json_follows_its_shipped_schema(run_copy, tmp_path):
    """The JSON Schema of results.json ships in the package; the documents of a real CPU run,
    a run recorded on two H200s and a synthetic run with a timeline all follow it, and a
    document that breaks it is refused."""
    import jsonschema

    from gpucheck.report.document import schema

    spec = schema()
    jsonschema.Draft202012Validator.check_schema(spec)
    gpu_run = tmp_path / "gpu"
    shutil.copytree(GPU_RUN, gpu_run)
    synthetic = tmp_path / "synth"
    make_run(synthetic)
    for folder in (run_copy, gpu_run, synthetic):
        doc = json.loads(publish(folder, formats=("json",)).paths["json"].read_text())
        jsonschema.validate(doc, spec)
    assert doc["timeline"] is not None  # the synthetic run's NVML timeline is covered too
    for broken in (
        {**doc, "summary": {**doc["summary"], "verdict": "maybe"}},
        {k: v for k, v in doc.items() if k != "cases"},
        {**doc, "cases": [{**doc["cases"][0], "status": "fine"}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, spec)
