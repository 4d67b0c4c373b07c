"""results.sarif: valid SARIF 2.1.0 (checked against the official JSON schema, vendored in
tests/fixtures/sarif with its source and licence), findings at file:line: a sanitizer
record at its CUDA source line with the case's Python frame, a test failure at its line in
the case's test file."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import jsonschema
import pytest
from clirun import gpucheck

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "fixtures" / "run_h200x2_selftest"
#: the SARIF 2.1.0 schema as https://json.schemastore.org/sarif-2.1.0.json serves it (OASIS
#: SARIF TC's schema; source, licence and checksum in tests/fixtures/sarif/README.md)
SCHEMA = Path(__file__).resolve().parents[1] / "fixtures" / "sarif" / "sarif-schema-2.1.0.json"


def validate(doc: dict) -> list[str]:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(
        schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
    )
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def _where(result: dict) -> tuple[str, int | None]:
    loc = result["locations"][0]["physicalLocation"]
    return loc["artifactLocation"]["uri"], loc.get("region", {}).get("startLine")


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    from gpucheck.report import publish, sarif

    run = tmp_path_factory.mktemp("sarif") / "example"
    shutil.copytree(EXAMPLE, run)
    done = publish(run, formats=("json",))
    return sarif.build(done.data, done.grouped, done.verdict, base=ROOT), done


def test_example_run_is_valid_sarif_with_source_lines(example):
    doc, done = example
    # the check is real: it rejects a log without a version, a tool without a driver
    assert validate({"runs": []}) and validate({"version": "2.1.0", "runs": [{"tool": {}}]})
    assert validate(doc) == []
    (run,) = doc["runs"]
    assert run["tool"]["driver"]["name"] == "gpucheck"
    assert {r["id"] for r in run["tool"]["driver"]["rules"]} == {
        "wrong-device",
        "wrong-stream",
        "numerics",
        "device-state-leak",
        "sanitizer",
        "crash",
        "cuda-error",
    }
    invocation = run["invocations"][0]
    assert (invocation["exitCode"], invocation["executionSuccessful"]) == (1, False)
    assert invocation["properties"]["verdict"] == done.verdict.name == "failed"
    found = run["results"]
    # every finding is in one result, counted (320 sanitizer records are 18 results)
    assert sum(r["properties"]["count"] for r in found) == sum(
        len(c.findings) for c in done.data.cases
    )
    assert len(found) < 60
    by_message = {r["message"]["text"].split(" (")[0]: r for r in found}
    overrun = by_message[
        "Invalid __global__ write of size 4 bytes x64 in <unnamed>::add_one defects.cu:10"
    ]
    assert _where(overrun) == ("suites/selftest/defects.cu", 10)  # the kernel's own source
    assert (
        overrun["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
    )
    related = overrun["relatedLocations"][0]["physicalLocation"]
    assert (related["artifactLocation"]["uri"], related["region"]["startLine"]) == (
        "suites/selftest/test_selftest.py",
        66,
    )  # the case's Python frame that launched it
    assert overrun["properties"]["devices"] == ["cuda:0", "cuda:1"]
    shared = next(r for r in found if "Invalid __shared__ write" in r["message"]["text"])
    assert _where(shared) == ("csrc/ssim/ssim_cuda.cu", 565)
    # a diagnosis on a case that passed is placed in the case's test file
    wrong = next(r for r in found if r["ruleId"] == "wrong-device")
    assert _where(wrong)[0] == "suites/selftest/test_defect_knn.py"
    assert wrong["level"] == "error" and wrong["properties"]["role"] == "diagnosis"


SUITE = textwrap.dedent("""
    def test_fine():
        pass

    def test_wrong():
        value = 41
        assert value == 42
""")


def test_run_and_report_write_only_the_formats_asked(tmp_path):
    suite = tmp_path / "suite" / "demo"
    suite.mkdir(parents=True)
    (suite / "test_demo.py").write_text(SUITE)
    out = tmp_path / "out"
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--quiet",
        "--suite",
        str(suite),
        "--out",
        str(out),
        "--format",
        "sarif",
        timeout=180,
        cwd=tmp_path,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not (out / "report.html").exists() and not (out / "junit.xml").exists()
    doc = json.loads((out / "results.sarif").read_text())
    assert validate(doc) == []
    (result,) = doc["runs"][0]["results"]
    assert result["ruleId"] == "test-failure" and "assert 41 == 42" in result["message"]["text"]
    # the failing line of the case's test file, relative to where gpucheck ran
    assert _where(result) == ("suite/demo/test_demo.py", 7)
    assert doc["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"] == tmp_path.as_uri() + "/"
    # the default of `gpucheck report` is today's three files; --format sarif adds nothing else
    rep = gpucheck("report", str(out), timeout=120, cwd=tmp_path)
    assert rep.returncode == 1
    assert all((out / f).exists() for f in ("report.html", "results.json", "junit.xml"))
    (out / "results.sarif").unlink()
    rep = gpucheck("report", str(out), "--format", "sarif", timeout=120, cwd=tmp_path)
    assert rep.returncode == 1 and rep.stdout.startswith(f"failed: {out / 'results.sarif'}")
    assert validate(json.loads((out / "results.sarif").read_text())) == []


def test_a_path_recorded_on_another_machine_is_found_under_the_base() -> None:
    """A run recorded in a GPU runner's checkout, reported from another checkout: the file is
    placed where the same tail of its path exists under the base."""
    from gpucheck.report.sarif import SRCROOT, _uri

    recorded = "/some/runner/checkout/suites/selftest/test_selftest.py"
    assert _uri(recorded, ROOT) == ("suites/selftest/test_selftest.py", SRCROOT)
    assert _uri("/some/runner/checkout/nowhere/x.py", ROOT) == (
        "file:///some/runner/checkout/nowhere/x.py",
        None,
    )
