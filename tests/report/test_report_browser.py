"""report.html in a real browser: headless Chromium through Selenium, checked through the DOM.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and the
``selenium`` package. Without them the tests are skipped locally, and fail in CI (``CI=true``),
where a missing browser must not pass silently. Screenshots go to ``$GPUCHECK_SHOTS`` (default:
the test's temporary folder).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from report_synth import CHROMIUM, chrome, make_run, real_cpu_run

from gpucheck.report import write_all

GPU_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "run_h200_selftest"


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e .[test])"
    if not any(shutil.which(c) for c in CHROMIUM):
        return "no chromium binary (apt-get install chromium chromium-driver)"
    if not shutil.which("chromedriver"):
        return "no chromedriver (apt-get install chromium-driver)"
    return None


def _require_browser() -> None:
    why = _missing()
    if why:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"browser tests cannot run in CI: {why}")
        pytest.skip(f"browser tests need headless Chromium: {why}")


@pytest.fixture(scope="module")
def driver():
    _require_browser()
    d = chrome()
    yield d
    d.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = Path(os.environ.get("GPUCHECK_SHOTS") or tmp_path_factory.mktemp("shots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _render(name: str, base: Path) -> Path:
    run = base / name
    if name == "run_h200_selftest":
        if not GPU_RUN.exists():
            pytest.skip("fixtures/run_h200_selftest not recorded yet")
        shutil.copytree(GPU_RUN, run, dirs_exist_ok=True)
    else:
        make_run(run, devices=2, cases=40, hours=0.02)
    return write_all(run)["html"]


@pytest.fixture(scope="module", params=["run_h200_selftest", "synthetic"])
def timeline_page(request, tmp_path_factory):
    """The run recorded on the GPU machine (fixtures/run_h200_selftest: one GPU, the self-test's
    crash and sanitizer findings), and a synthetic 2-GPU run with a stray context."""
    return request.param, _render(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def gpu_page(tmp_path_factory):
    return _render("run_h200_selftest", tmp_path_factory.mktemp("gpu"))


@pytest.fixture(scope="module")
def cpu_page(tmp_path_factory):
    return write_all(real_cpu_run(tmp_path_factory.getbasetemp()))["html"]


def _open(driver, page: Path) -> None:
    driver.get(page.resolve().as_uri())
    driver.get_log("browser")  # start from an empty console log
    driver.refresh()


def _errors(driver) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _full_shot(driver, path: Path) -> None:
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1400, min(height + 100, 16000))
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)


def _visible(driver, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return [e for e in driver.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]


def _select(driver, control: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, control)).select_by_value(value)


def test_page_matrix_findings_filters(driver, cpu_page, shots):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _open(driver, cpu_page)
    _full_shot(driver, shots / "cpu_run.png")
    assert _errors(driver) == []
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    cell = driver.find_element(By.CSS_SELECTOR, "table.matrix td.cell")
    assert cell.is_displayed() and "crashed" in cell.get_attribute("class")
    cards = _visible(driver, "article.card")
    assert {c.get_attribute("data-kind") for c in cards} == {
        "crash",
        "hang",
        "cuda-error",
        "test-failure",
    }
    crash = driver.find_element(By.CSS_SELECTOR, "article.card[data-kind=crash]")
    assert "SIGABRT" in crash.text and "thrust::system_error" in crash.text
    # the kind filter hides the other kinds' cards and their sections
    _select(driver, "f-kind", "hang")
    assert [c.get_attribute("data-kind") for c in _visible(driver, "article.card")] == ["hang"]
    assert not driver.find_element(By.ID, "kind-crash").is_displayed()
    # one card per (kind, op): the two test failures (no op) share one
    assert "1 of 4" in driver.find_element(By.ID, "f-count").text
    # status filter on the case rows
    driver.find_element(By.ID, "f-reset").click()
    _select(driver, "f-status", "crashed")
    rows = _visible(driver, "table.cases tr[data-status]")
    assert [r.get_attribute("data-status") for r in rows] == ["crashed"]
    # search
    driver.find_element(By.ID, "f-reset").click()
    driver.find_element(By.ID, "f-search").send_keys("assert [1, 2]")
    WebDriverWait(driver, 10).until(  # the search is debounced
        lambda d: len(_visible(d, "article.card")) == 1
    )
    assert [c.get_attribute("data-kind") for c in _visible(driver, "article.card")] == [
        "test-failure"
    ]
    driver.find_element(By.ID, "f-reset").click()
    # a matrix cell leads to its cases; passed ones are listed on demand
    cell.find_element(By.TAG_NAME, "a").click()
    lazy = driver.find_element(By.CSS_SELECTOR, "details.lazy")
    summary = lazy.find_element(By.TAG_NAME, "summary")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", summary)
    summary.click()
    WebDriverWait(driver, 10).until(lambda d: lazy.find_elements(By.CSS_SELECTOR, "tr"))
    listed = lazy.find_elements(By.CSS_SELECTOR, "tr[data-status]")
    assert sorted(r.get_attribute("data-status") for r in listed) == [
        "passed",
        "passed",
        "skipped",
        "skipped",
    ]
    assert any("test_last" in r.text for r in listed)
    assert _errors(driver) == []


def test_timelines_and_device_filter(driver, timeline_page, shots):
    from selenium.webdriver.common.by import By

    name, page = timeline_page
    _open(driver, page)
    _full_shot(driver, shots / f"{name}.png")
    assert _errors(driver) == []
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    plots = _visible(driver, "figure.plot")
    assert plots
    for plot in plots:
        lines = plot.find_elements(By.CSS_SELECTOR, "svg.timeline polyline.proc")
        assert lines, plot.text
        assert all(len(p.get_attribute("points").split()) >= 2 for p in lines)
        box = plot.find_element(By.CSS_SELECTOR, "svg.timeline").rect
        assert box["width"] > 600 and box["height"] > 100
    driver.find_element(By.ID, "timelines").screenshot(str(shots / f"{name}_timelines.png"))
    if name == "synthetic":  # a stray context is visible at a glance
        assert len(_visible(driver, "figure.plot.stray")) == 2
        assert _visible(driver, "polyline.strayline")
    options = driver.find_elements(By.CSS_SELECTOR, "#f-device option")
    devices = [o.get_attribute("value") for o in options if o.get_attribute("value")]
    if len(devices) > 1:
        _select(driver, "f-device", devices[-1])
        for card in _visible(driver, "article.card"):
            assert devices[-1] in card.get_attribute("data-device").split()
        rows = _visible(driver, "table.matrix tr[data-device]")
        assert [r.get_attribute("data-device") for r in rows] == [devices[-1]]
        shown = [p.get_attribute("data-device") for p in _visible(driver, "figure.plot")]
        assert devices[-1] in shown and devices[0] not in shown
    assert _errors(driver) == []


def test_gpu_run_findings(driver, gpu_page, shots):
    """The self-test's real findings: a crash with its abort message, memcheck records with
    kernel, access, thread/block and the extension's host frames."""
    from selenium.webdriver.common.by import By

    _open(driver, gpu_page)
    crash = driver.find_element(By.CSS_SELECTOR, "article.card[data-kind=crash]")
    assert crash.is_displayed() and "terminate called" in crash.text
    # one card per kernel (or CUDA API call): the out-of-bounds write's card is add_one's
    san = next(
        c
        for c in driver.find_elements(By.CSS_SELECTOR, "article.card[data-kind=sanitizer]")
        if "Invalid __global__ write of size 4 bytes" in c.text
    )
    assert "add_one" in san.find_element(By.CSS_SELECTOR, "h4 .subject").text
    for field in ("kernel", "thread", "block", "address"):
        assert san.find_element(By.XPATH, f".//th[text()='{field}']").is_displayed()
    assert "gpucheck_selftest_defects.so" in san.text
    driver.set_window_size(1400, 3000)
    driver.find_element(By.ID, "kind-sanitizer").screenshot(
        str(shots / "run_h200_selftest_sanitizer.png")
    )
    driver.set_window_size(1400, 1000)
    _select(driver, "f-kind", "crash")
    assert not san.is_displayed() and crash.is_displayed()
    assert _errors(driver) == []


@pytest.mark.parametrize(
    ("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_missing_browser_fails_in_ci_and_skips_elsewhere(monkeypatch, ci, outcome):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=r"chromium|selenium"):
        _require_browser()
