"""A worker's side of a sanitizer pass (gpucheck.worker.sanitizer_pass), on recorded log
text written into a real log file: each case reads its own slice, counts the records the
tool printed, and says when the next case could not print its share (a fresh worker), or
that the tool's limit was reached during a case."""

from __future__ import annotations

from pathlib import Path

from gpucheck.detectors.base import CaseInfo
from gpucheck.sanitizer import command
from gpucheck.worker.sanitizer_pass import SanitizerPass

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sanitizer"
TEXT = (FIXTURES / "initcheck_uninit_planted_h200.log").read_text()
RECORDS = "".join(line for line in TEXT.splitlines(True) if "SUMMARY" not in line)  # 20


def test_the_records_of_each_case_count_against_the_workers_print_limit(tmp_path):
    log = tmp_path / "w.sanitizer.4242.log"
    log.write_text("")
    san = SanitizerPass(str(tmp_path / "w.sanitizer.%p.log"), "initcheck")
    first, second = CaseInfo("cuda:0", "s", "t.py::a"), CaseInfo("cuda:0", "s", "t.py::b")
    with log.open("a") as f:
        f.write(RECORDS * 10)  # 200 records
    [found] = san.findings(first, False)
    assert found.kind == "sanitizer" and "x200" in found.message
    assert san.printed == {str(log): 200} and san.offsets == {str(log): log.stat().st_size}
    assert not san.budget_spent() and san.limited is None
    with log.open("a") as f:
        f.write(RECORDS * 31)  # 820 in all: fewer than a case's share left
    san.findings(second, False)
    assert san.budget_spent() and san.limited is None  # nothing dropped yet
    with log.open("a") as f:
        f.write(RECORDS * 9)  # the 1000th
    san.findings(first, False)
    assert san.printed[str(log)] == command.PRINT_LIMIT and san.limited == ("s", "t.py::a")
