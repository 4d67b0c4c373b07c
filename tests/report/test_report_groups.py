"""Diagnoses first, one card per (kind, op or kernel), symptoms folded under the diagnosis that
explains them: on the real example run (tests/fixtures/run_h200x2_selftest, the run of
reports/example: 2 H200s, gpucheck's defect builds) and on records written with the package's
own writers."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from gpucheck.model import results
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.report import groups, publish, rundata

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "run_h200x2_selftest"
#: what a maintainer must be able to read in the page, at most this big
MAX_PAGE = 1_000_000


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    run = tmp_path_factory.mktemp("example") / "example"
    shutil.copytree(EXAMPLE, run)
    for name in ("report.html", "results.json", "junit.xml"):
        (run / name).unlink(missing_ok=True)
    return run, publish(run)


def test_example_findings_are_grouped_diagnoses_first(example):
    _, done = example
    g = done.grouped
    assert [(d.kind, d.subject, d.count) for d in g.diagnoses] == [
        ("wrong-device", "gpucheck_defect_output_current_device::knn_mean_sq_dist", 18),
        ("wrong-stream", "gpucheck_defect_legacy_stream::ssim_forward", 4),
        ("wrong-stream", "gpucheck_defect_legacy_stream::ssim_backward", 2),
        ("numerics", "gpucheck_defect_nondeterminism::knn_mean_sq_dist", 2),
        ("device-state-leak", None, 2),
        ("device-state-leak", "gpucheck_defect_set_device::knn_mean_sq_dist", 2),
    ]
    wrong = g.diagnoses[0]  # 9 kernels on each of 2 devices: one card, both devices inside
    assert wrong.devices == ["cuda:0", "cuda:1"] and len(wrong.cases) == 2
    # every finding of the run is in exactly one group
    cases = done.data.cases
    total = sum(len(r.findings) for r in cases)
    assert sum(x.count for x in g.all()) + sum(d.explained for d in g.diagnoses) == total
    # the 320 raw sanitizer records are a few groups, one per kernel or CUDA API call
    san = [s for s in g.symptoms if s.kind == "sanitizer"]
    assert sum(s.count for s in san) == 320 and len(san) <= 10
    assert "gpucheck::ssim::<unnamed>::ssim_backward_kernel<float, (bool)1>" in {
        s.subject for s in san
    }
    # the current parser names the function the old run recorded as 'const'
    assert "const" not in {s.subject for s in san}
    assert "gpucheck::ssim::<unnamed>::ChunkLoader<float>::store" in {s.subject for s in san}
    # racecheck records of one barrier differ only in addresses: 4 distinct messages
    backward = next(s for s in san if s.subject and "ssim_backward_kernel" in s.subject)
    assert backward.count == 176 and len(backward.messages) == 4


def test_example_page_leads_with_diagnoses_and_is_under_a_megabyte(example):
    run, done = example
    html = done.paths["html"].read_text()
    size = len(html.encode())
    assert size <= MAX_PAGE, size  # it was 2,097,576 bytes with one card per message
    # the glance list at the top names every diagnosis before any section
    top = html[: html.index('<nav class="toc">')]
    leading = dict(done.grouped.ranked())["diagnoses"]
    assert top.count('<li><a href="#d-') == len(leading)
    assert html.index('id="diagnosis"') < html.index('id="symptom"') < html.index('id="warning"')
    assert "Warnings and notes (they explain no failure)" in top  # device-state-leak warnings
    cards = re.findall(r'<article class="card sev-\w+ role-(\w+)" id="([^"]+)"', html)
    sections = [card_id.split("-")[0] for _, card_id in cards]
    assert sections == sorted(sections, key="dsw".index)  # diagnoses, symptoms, warnings
    assert len(cards) == len(done.grouped.all())
    # nothing a maintainer needs was lost: every distinct message, kernel and case is there
    text = re.sub(r"&#3[49];|&quot;|&amp;|&lt;|&gt;", "", html)
    for r in done.data.cases:
        for f in r.findings:
            message = groups.signature(f.message).splitlines()[0]
            message = re.sub(r"[\"'&<>]", "", message)
            assert message[:80] in text, f.message[:120]
            assert r.case in html
    doc = json.loads((run / "results.json").read_text())
    assert [d["kind"] for d in doc["diagnoses"]] == [d.kind for d in done.grouped.diagnoses]
    assert sum(s["count"] for s in doc["symptoms"]) == sum(s.count for s in done.grouped.symptoms)


def _rec(case: str, device: str, mode: str, status: str, *findings: Finding) -> dict:
    return CaseRecord(
        run_id="r",
        device=device,
        suite="ssim",
        case=case,
        mode=mode,
        status=status,
        findings=list(findings),
    ).to_json()


def test_a_diagnosis_folds_the_symptoms_of_its_cases(tmp_path):
    """test_x[cuda1]: a wrong-device diagnosis explains the crash, the CUDA error and the
    memcheck record of the same case (in any mode); the same crash on test_y, which has no
    diagnosis, stays a symptom of its own."""
    path = tmp_path / "results.jsonl"
    crash = Finding("crash", "error", "worker killed by SIGABRT while running this case")
    cuda = Finding("cuda-error", "error", "CUDA error: an illegal memory access", op="ext::ssim")
    memcheck = Finding(
        "sanitizer", "error", "Invalid __global__ read of size 4 bytes", kernel="ssim_kernel"
    )
    results.append(path, _rec("t.py::test_x[cuda1]", "cuda:1", "blocking", "failed", cuda))
    results.append(
        path,
        _rec("t.py::test_x[cuda1]", "cuda:1", "sanitizer:memcheck", "crashed", memcheck, crash),
    )
    results.append(path, _rec("t.py::test_y[cuda1]", "cuda:1", "blocking", "crashed", crash))
    results.append(
        path,
        {
            "schema": results.SCHEMA_ID,
            "record": "diagnosis",
            "run_id": "r",
            "device": "cuda:1",
            "suite": "ssim",
            "case": "t.py::test_x[cuda1]",
            "mode": "blocking",
            "findings": [
                Finding(
                    "wrong-device",
                    "error",
                    "ext::ssim launches on the current device",
                    op="ext::ssim",
                ).__dict__
            ],
        },
    )
    g = groups.build(rundata.load(tmp_path).cases)
    (diag,) = g.diagnoses
    assert (diag.kind, diag.subject) == ("wrong-device", "ext::ssim")
    assert Counter({e.kind: e.count for e in diag.explains}) == {
        "crash": 1,
        "cuda-error": 1,
        "sanitizer": 1,
    }
    assert [(s.kind, s.cases) for s in g.symptoms] == [("crash", [("ssim", "t.py::test_y[cuda1]")])]
    html = publish(tmp_path).paths["html"].read_text()
    card = html[html.index('id="d-0"') : html.index('id="symptom"')]
    assert '<details class="explains">' in card and "explains 3 symptom finding(s)" in card
    assert "Invalid __global__ read of size 4 bytes" in card  # folded, with its evidence
    assert "t.py::test_y[cuda1]" not in card


def test_a_warning_diagnosis_does_not_explain_a_crash(tmp_path):
    path = tmp_path / "results.jsonl"
    results.append(
        path,
        _rec(
            "t.py::z",
            "cuda:0",
            "blocking",
            "crashed",
            Finding("stray-context", "warning", "context on cuda:1"),
            Finding("crash", "error", "worker killed by SIGSEGV"),
        ),
    )
    g = groups.build(rundata.load(tmp_path).cases)
    assert [d.explains for d in g.diagnoses] == [[]]
    assert [s.kind for s in g.symptoms] == ["crash"]


@pytest.mark.parametrize(
    ("finding", "record", "role"),
    [
        ({"kind": "wrong-device"}, {}, "diagnosis"),
        ({"kind": "my-own-check"}, {}, "diagnosis"),  # a user's detector names a cause
        ({"kind": "numerics", "message": "op: non-deterministic: ..."}, {}, "diagnosis"),
        ({"kind": "numerics", "message": "mismatch against the reference: ..."}, {}, "symptom"),
        ({"kind": "hang"}, {}, "symptom"),
        ({"kind": "hang"}, {"distributed": {"cause_ranks": [1]}}, "diagnosis"),
        ({"kind": "sanitizer"}, {}, "symptom"),
        ({"kind": "crash"}, {}, "symptom"),
    ],
)
def test_roles(finding, record, role):
    read = CaseRecord.from_json(
        {"device": "cuda:0", "suite": "s", "case": "t.py::x", "status": "failed", **record}
    )
    assert read is not None
    assert groups.role(Finding.from_json({"severity": "error", **finding}), read) == role


def test_the_root_cause_leads_and_explains_the_symptoms_of_its_case():
    """A missing guard and a legacy-stream launch in one extension, on two GPUs and three
    cases: the stream bug has more findings, but the guard made the kernel fault, so it
    leads and the crash and CUDA error are folded under it; each op is one group across
    cases and devices."""
    from gpucheck.model.results import CaseRecord, Finding
    from gpucheck.report.groups import build

    def case(device: str, name: str, *kinds: str) -> CaseRecord:
        index = device[-1]
        found = [
            Finding(
                k,
                "error",
                f"{k} in render",
                device=device,
                suite="zoo",
                case=f"test_r.py::{name}[cuda{index}]",
                op=None if k in ("crash", "cuda-error") else "ext._C.render",
            )
            for k in kinds
        ]
        return CaseRecord(
            "r",
            device,
            "zoo",
            f"test_r.py::{name}[cuda{index}]",
            "blocking+nvml",
            "failed" if "cuda-error" in kinds else "passed",
            findings=found,
        )

    records = [
        case("cuda:1", "test_a", "cuda-error", "wrong-stream", "wrong-device"),
        case("cuda:0", "test_a", "cuda-error", "wrong-device", "wrong-stream"),
        case("cuda:0", "test_b", "wrong-stream"),
        case("cuda:1", "test_c", "wrong-stream"),
    ]
    g = build(records)
    assert [(d.kind, d.subject, d.count) for d in g.diagnoses] == [
        ("wrong-device", "ext._C.render", 2),
        ("wrong-stream", "ext._C.render", 4),
    ]
    assert g.diagnoses[0].devices == ["cuda:0", "cuda:1"]
    assert [(e.kind, e.count) for e in g.diagnoses[0].explains] == [("cuda-error", 2)]
    assert g.symptoms == []


def test_a_warning_a_suite_attached_never_ranks_above_the_cases_own_failure():
    from gpucheck.model.results import CaseRecord, Finding
    from gpucheck.report.groups import build

    where = {"device": "cuda:0", "suite": "mine", "case": "test_m.py::test_m[cuda0]"}
    record = CaseRecord(
        "r",
        "cuda:0",
        "mine",
        "test_m.py::test_m[cuda0]",
        "blocking+nvml",
        "failed",
        findings=[
            Finding("slow-path", "warning", "fell back to the slow path", **where),
            Finding("test-failure", "error", "AssertionError: 1 == 2", **where),
        ],
    )
    ranked = build([record]).ranked()
    assert [(title, [g.kind for g in groups]) for title, groups in ranked] == [
        ("symptoms no diagnosis explains", ["test-failure"]),
        ("warnings and notes", ["slow-path"]),
    ]


#: per-call diagnoses that explain a case's failing assert (the last two: sanitizer records
#: traced to the call that launched the kernel)
PER_CALL = (
    "unwritten-output",
    "memory-layout",
    "wrong-stream",
    "wrong-device",
    "mixed-devices",
    "data-race",
    "out-of-bounds",
)
ASSERT = "AssertionError: Tensor-likes are not close!"


def _failed_assert(tmp_path, *diagnoses: Finding) -> Path:
    """A run folder of one case that failed its own assert (test_ssim.py:41) and carries the
    per-call ``diagnoses``; the assert is recorded first, as the recorder does."""
    path = tmp_path / "results.jsonl"
    failure = Finding(
        "test-failure",
        "error",
        ASSERT,
        evidence="test_ssim.py:41: in test_grad\n    torch.testing.assert_close(grad, ref)\n"
        + ASSERT,
    )
    record = _rec("test_ssim.py::test_grad[cuda0]", "cuda:0", "blocking+nvml", "failed", failure)
    record["reason"] = ASSERT
    record["findings"] += [f.__dict__ for f in diagnoses]
    results.append(path, record)
    return tmp_path


@pytest.mark.parametrize("kind", PER_CALL)
def test_a_failing_assert_is_the_symptom_of_the_per_call_finding_in_every_format(tmp_path, kind):
    import io
    import xml.etree.ElementTree as ET

    from rich.console import Console

    from gpucheck.report import console

    op = "ssim._C.fusedssim_backward"
    message = f"{op}: {kind} of argument 2 (img1)"
    run = _failed_assert(tmp_path, Finding(kind, "error", message, op=op, hint="the fix"))
    done = publish(run, formats=("html", "json", "junit", "sarif"))
    g = done.grouped
    # console: the diagnosis leads, the assert is what it explains
    out = io.StringIO()
    console.print_findings(Console(file=out, width=300), g)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("diagnoses: 1 group(s)")
    assert lines[1].strip().startswith(f"{kind} {op}") and "explains 1 test-failure" in lines[1]
    assert not any("symptoms no diagnosis explains" in x for x in lines)
    # results.json: one diagnosis, the assert folded under it
    doc = json.loads((run / "results.json").read_text())
    assert [(d["kind"], [e["kind"] for e in d["explains"]]) for d in doc["diagnoses"]] == [
        (kind, ["test-failure"])
    ]
    assert doc["symptoms"] == []
    # report.html: the diagnosis card holds the assert, with its evidence
    html = done.paths["html"].read_text()
    cards = re.findall(r'<article class="card sev-\w+ role-(\w+)" id="([^"]+)"', html)
    assert cards == [("diagnosis", "d-0")]  # the assert has no card of its own: folded in
    card = html[html.index('id="d-0"') :]
    assert "explains 1 symptom finding(s)" in card and "Tensor-likes are not close!" in card
    # junit.xml: the diagnosis is the failure's message, the assert its symptom
    (failure,) = ET.parse(run / "junit.xml").getroot().iter("failure")
    assert failure.get("message") == f"{kind}: {message} (symptom: {ASSERT})"
    text = failure.text or ""
    assert text.startswith(f"[error] {kind}: {message}")
    assert f"symptom of {kind} {op}: [error] test-failure: {ASSERT}" in text
    # results.sarif: the diagnosis first, placed with its symptom; the assert says whose it is
    found = json.loads((run / "results.sarif").read_text())["runs"][0]["results"]
    assert [r["ruleId"] for r in found] == [kind, "test-failure"]
    assert found[0]["properties"]["explains"] == [f"symptom: test-failure: {ASSERT}"]
    (related,) = found[0]["relatedLocations"]
    assert related["physicalLocation"]["region"]["startLine"] == 41
    assert found[1]["message"]["text"].startswith(f"symptom of {kind} {op}: {ASSERT}")
    assert found[1]["properties"]["explainedBy"] == f"{kind} {op}"


def test_a_wrong_value_is_explained_by_the_layout_not_by_the_stream(tmp_path):
    """A case whose op launches on the legacy stream and reads a permuted input as if
    contiguous: under CUDA_LAUNCH_BLOCKING the stream bug cannot make the assert fail, the
    layout can; both stay diagnoses, the layout leads."""
    op = "ssim._C.fusedssim_backward"
    run = _failed_assert(
        tmp_path,
        Finding("wrong-stream", "error", "kernel on stream 0", op=op),
        Finding("memory-layout", "error", "reads img1 as if contiguous", op=op),
    )
    g = groups.build(rundata.load(run).cases)
    assert [(d.kind, [e.kind for e in d.explains]) for d in g.diagnoses] == [
        ("memory-layout", ["test-failure"]),
        ("wrong-stream", []),
    ]
    (record,) = rundata.load(run).cases
    assert [(place, f.kind) for place, f in g.reading(record)] == [
        ("lead", "memory-layout"),
        ("diagnosis", "wrong-stream"),
        ("symptom", "test-failure"),
    ]


def test_a_case_without_a_diagnosis_keeps_its_assert_first(tmp_path):
    import xml.etree.ElementTree as ET

    run = _failed_assert(tmp_path)
    publish(run, formats=("junit",))
    (failure,) = ET.parse(run / "junit.xml").getroot().iter("failure")
    assert failure.get("message") == ASSERT
    assert (failure.text or "").startswith(f"[error] test-failure: {ASSERT}")


#: the root causes first, as the detectors declare them (what each explains: groups.precedence)
ROOT_CAUSES_FIRST = (
    "wrong-device",
    "mixed-devices",
    "out-of-bounds",
    "device-state-leak",
    "stray-context",
    "double-activation",
    "oom-anomaly",
    "unwritten-output",
    "memory-layout",
    "data-race",
    "wrong-stream",
    "leak",
    "memory-growth",
    "numerics",
    "not-reproducible",
)


def test_each_kind_has_one_place_in_the_precedence():
    declared = groups.kinds()
    places = [k.precedence for k in declared.by_name.values() if k.precedence is not None]
    assert len(set(places)) == len(places), "two kinds declare one place"
    assert declared.precedence == ROOT_CAUSES_FIRST
    assert [groups.precedence(k) for k in ROOT_CAUSES_FIRST] == list(range(len(ROOT_CAUSES_FIRST)))
    # a kind without a place (a user's, an undeclared one) comes after every one with a place
    assert groups.precedence("imbalance") == groups.precedence("my-own-check") == len(places)
    # what gives wrong values comes before a launch on the legacy stream (always right under
    # CUDA_LAUNCH_BLOCKING), after what makes the kernel fault
    order = [groups.precedence(k) for k in ("mixed-devices", "memory-layout", "wrong-stream")]
    assert order == sorted(order)
    assert max(groups.precedence(k) for k in ("unwritten-output", "data-race")) < order[2]
