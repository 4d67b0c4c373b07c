"""`gpucheck selftest`'s zoo: recall and unexpected findings per row, on records built by
hand in the results.jsonl format (a row found, missed, with an unexpected finding, with
symptoms its diagnosis explains, not run on one GPU), and the zoo's cases and builds as they
are in the suite and in gpucheck._csrc."""

from __future__ import annotations

import ast

import pytest
from test_selftest_matrix import _finding, _rec, typed

from gpucheck import _resources, cli, selftest
from gpucheck._csrc import compile_check
from gpucheck._csrc import zoo as zoo_builds
from gpucheck.selftest import ZOO, verdict, zoo_matrix

PLAIN = "blocking+nvml"
RERUN = "blocking+nvml|rerun:target-current"


def by_name(results):
    return {z.row.name: z for z in results}


def row_named(part):
    return next(r for r in ZOO if part in r.name)


KNN_FIX = row_named("published fix")  # device-state-leak (2 GPUs) + wrong-stream
SSIM_NOGUARD = row_named("SSIM loss without")  # wrong-device (2 GPUs)
RNN_CLEAN = row_named("custom RNN, clean")
MOD = "gpucheck_zoo_knn_setdevice_thrust0"


def _knn_fix(dev, *findings, status="passed"):
    return _rec(KNN_FIX.cases[0], dev, PLAIN, *findings, status=status)


def _judge(records, devices):
    return by_name(zoo_matrix(typed(records), devices))


def test_a_row_whose_findings_all_appear_is_found_with_full_recall():
    records = [
        _knn_fix(
            dev,
            _finding("device-state-leak", dev, "warning", op=f"{MOD}.distCUDA2"),
            _finding("wrong-stream", dev, op=f"{MOD}.distCUDA2"),
        )
        for dev in ("cuda:0", "cuda:1")
    ]
    z = _judge(records, 2)[KNN_FIX.name]
    assert z.recall == (2, 2) and not z.missed and not z.unexpected and not z.not_run


def test_a_missing_expected_finding_is_a_miss_and_fails_the_verdict():
    records = [
        _knn_fix("cuda:0", _finding("wrong-stream", "cuda:0", op=f"{MOD}.distCUDA2")),
        _knn_fix(
            "cuda:1",
            _finding("wrong-stream", "cuda:1", op=f"{MOD}.distCUDA2"),
            _finding("device-state-leak", "cuda:1", "warning", op=MOD),
        ),
    ]
    results = zoo_matrix(typed(records), 2)
    z = by_name(results)[KNN_FIX.name]
    assert z.recall == (1, 2)
    assert [(e.kind, why) for e, why in z.missed] == [
        ("device-state-leak", f"not found on {KNN_FIX.cases[0]}[cuda0] cuda:0")
    ]
    assert verdict([], [], results) == 1


def test_a_finding_of_another_kind_or_op_is_unexpected():
    dev = "cuda:0"
    records = [
        _knn_fix(
            dev,
            _finding("wrong-stream", dev, op=f"{MOD}.distCUDA2"),
            _finding("numerics", dev, op=f"{MOD}.distCUDA2"),
            _finding("wrong-stream", dev, op="gpucheck_zoo_knn_clean.distCUDA2"),
            _finding("stand-down", dev, "info"),
        )
    ]  # info: never counted
    z = _judge(records, 1)[KNN_FIX.name]
    assert z.recall == (1, 1)
    assert [(u["kind"], u["op"]) for u in z.unexpected] == [
        ("numerics", f"{MOD}.distCUDA2"),
        ("wrong-stream", "gpucheck_zoo_knn_clean.distCUDA2"),
    ]


def test_a_finding_on_a_clean_twin_is_unexpected():
    records = [_rec(case, "cuda:0", PLAIN) for case in RNN_CLEAN.cases]
    records[1]["findings"].append(
        _finding("mixed-devices", "cuda:0", op="gpucheck_zoo_rnn_clean.forward")
    )
    results = zoo_matrix(typed(records), 1)
    z = by_name(results)[RNN_CLEAN.name]
    assert z.recall == (0, 0) and z.ran
    assert [u["kind"] for u in z.unexpected] == ["mixed-devices"]
    assert verdict([], [], results) == 1


def _noguard(dev, diagnosed=True):
    """The no-guard SSIM case on two GPUs: it fails with the other device current (symptoms),
    the re-run with its own device current passes, and the diagnosis names the op."""
    case = SSIM_NOGUARD.cases[0]
    recs = [
        _rec(
            case,
            dev,
            PLAIN,
            _finding("cuda-error", dev),
            _finding("test-failure", dev),
            status="failed",
        ),
        _rec(case, dev, RERUN),
    ]
    if diagnosed:
        recs.append(
            _rec(
                case,
                dev,
                PLAIN,
                _finding(
                    "wrong-device",
                    dev,
                    op="gpucheck_zoo_ssim_noguard::fusedssim(double, double, "
                    "at::Tensor const&, at::Tensor const&, bool)",
                ),
                status="failed",
                record="diagnosis",
            )
        )
    return recs


def test_symptoms_explained_by_the_expected_diagnosis_are_not_unexpected():
    records = _noguard("cuda:0") + _noguard("cuda:1")
    z = _judge(records, 2)[SSIM_NOGUARD.name]
    assert z.recall == (1, 1) and z.unexpected == []


def test_symptoms_without_their_diagnosis_are_unexpected_and_the_row_missed():
    records = _noguard("cuda:0") + _noguard("cuda:1", diagnosed=False)
    z = _judge(records, 2)[SSIM_NOGUARD.name]
    assert z.recall == (0, 1)
    assert sorted(u["kind"] for u in z.unexpected) == ["cuda-error", "test-failure"]
    assert {u["device"] for u in z.unexpected} == {"cuda:1"}


def test_a_wrong_device_finding_without_an_op_may_be_the_expected_one():
    dev = "cuda:0"
    records = [r for r in _noguard(dev) if r["record"] == "case"]
    records[0]["findings"].append(_finding("wrong-device", dev))  # e.g. a stray context
    records += [r for r in _noguard(dev) if r["record"] == "diagnosis"]
    z = _judge(records, 2)[SSIM_NOGUARD.name]
    assert z.unexpected == []


def test_expectations_needing_two_gpus_do_not_run_on_one():
    dev = "cuda:0"
    records = [
        _knn_fix(dev, _finding("wrong-stream", dev, op=f"{MOD}.distCUDA2")),
        _rec(SSIM_NOGUARD.cases[0], dev, PLAIN),
    ]
    results = zoo_matrix(typed(records), 1)
    knn, ssim = by_name(results)[KNN_FIX.name], by_name(results)[SSIM_NOGUARD.name]
    assert knn.recall == (1, 1)
    assert [(e.kind, why) for e, why in knn.not_run] == [("device-state-leak", "needs 2 GPUs")]
    assert ssim.recall == (0, 0) and ssim.unexpected == [] and ssim.ran
    assert verdict([], [], results) == 2  # nothing missed, some could not run
    # on one GPU, the two-GPU kind is no excuse: a wrong-device there is unexpected
    records[1]["findings"].append(_finding("wrong-device", dev, op="gpucheck_zoo_ssim_noguard"))
    assert [
        u["kind"] for u in by_name(zoo_matrix(typed(records), 1))[SSIM_NOGUARD.name].unexpected
    ] == ["wrong-device"]


def test_a_row_whose_cases_did_not_run_is_not_run():
    other = typed([_rec("test_selftest.py::test_abort", "cuda:0", PLAIN)])  # a plain pass
    z = by_name(zoo_matrix(other, 2))[KNN_FIX.name]
    assert not z.ran and z.recall == (0, 0)
    assert {why for _, why in z.not_run} == {"its case did not run"}
    twin = by_name(zoo_matrix(other, 2))[RNN_CLEAN.name]
    assert not twin.ran and not twin.not_run and verdict([], [], [twin]) == 2


def test_the_zoo_has_real_multi_defect_rows_and_clean_twins():
    defects = [r for r in ZOO if r.expected]
    assert len(ZOO) >= 12 and len(ZOO) - len(defects) >= 4
    assert sum(len({(e.kind, e.op) for e in r.expected}) >= 2 for r in defects) * 2 >= len(defects)
    for row in ZOO:
        assert all(e.case in row.cases for e in row.expected)


def test_every_zoo_case_is_a_test_of_its_file_and_every_build_is_used():
    root = _resources.suites() / "selftest"
    used = set()
    for row in ZOO:
        for case in row.cases:
            path, _, name = case.partition("::")
            source = (root / path).read_text()
            tests = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
            assert name in tests, case
            used |= {b for b in zoo_builds.ZOO_BUILDS if f'"{b}"' in source}
    assert used == set(zoo_builds.ZOO_BUILDS)
    for build, (family, defects) in zoo_builds.ZOO_BUILDS.items():
        assert [f.name for f in zoo_builds.sources(build)] == [
            f"zoo_{family}.cpp",
            f"zoo_{family}.cu",
        ]
        assert zoo_builds.flags(build) == [f"-DGPUCHECK_ZOO_{d}" for d in defects]


def test_the_compile_check_compiles_every_zoo_defect_under_its_macros():
    units, missing = compile_check.check_units("only")
    assert missing == []
    zoo = {(src.name, label) for src, _, label in units if label.startswith(" [zoo ")}
    for build, (_family, defects) in zoo_builds.ZOO_BUILDS.items():
        if defects:
            assert any(label == f" [zoo {build}]" for _, label in zoo), build
    # the .cu of a build whose only defect is the guard is the clean one: not compiled again
    assert ("zoo_knn.cu", " [zoo knn_noguard]") not in zoo
    assert ("zoo_knn.cpp", " [zoo knn_noguard]") in zoo
    everything = {src.name for src, _, _ in compile_check.check_units("skip")[0]}
    assert {
        f"zoo_{f}{s}" for f in ("raster", "ssim", "knn", "rnn") for s in (".cpp", ".cu")
    } <= everything


def test_selftest_command_prints_the_zoo(tmp_path, monkeypatch, capsys, two_gpus):
    from gpucheck.controller import entry

    case = KNN_FIX.cases[0]
    lines = [
        _knn_fix(
            dev, _finding("wrong-stream", dev, op=f"{MOD}.distCUDA2"), _finding("numerics", dev)
        )
        for dev in ("cuda:0", "cuda:1")
    ]

    monkeypatch.setattr(selftest, "read_run", lambda run_dir: (typed(lines), 2))
    monkeypatch.setattr(entry, "run", lambda cfg: 1)  # the harness: its records are above
    monkeypatch.setattr(selftest, "prebuild", lambda logs: None)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["selftest", "--out", "run"])
    out = capsys.readouterr().out
    assert code == 1
    assert "zoo (real-shaped extensions)" in out
    # the device-state-leak it expects is missing; the other rows' cases did not run
    assert "zoo: recall 1 of 2 expected findings that could run here" in out
    assert "unexpected findings: 2 (numerics)" in out
    assert f"unexpected: cuda:0 {case}[cuda0] ({PLAIN}): numerics" in out


#: the record mode of each pass a zoo expectation names
PASS_MODES = {"plain": PLAIN, "sanitizer:racecheck": "sanitizer:racecheck"}


@pytest.mark.parametrize("row", ZOO, ids=lambda r: r.name)
def test_each_row_found_from_its_own_findings_has_nothing_unexpected(row):
    """Every row, given exactly the findings it expects in the pass each is expected in
    (symptoms beside its errors), is found in full with nothing unexpected on two GPUs."""
    records = []
    for dev in ("cuda:0", "cuda:1"):
        for case in row.cases:
            modes = {e.mode for e in row.expected if e.case == case} or {"plain"}
            for mode in sorted(modes):
                mine = [e for e in row.expected if e.case == case and e.mode == mode]
                fs = [_finding(e.kind, dev, e.severity, op=e.op) for e in mine]
                if any(e.kind == "wrong-device" for e in mine):
                    fs.append(_finding("cuda-error", dev))
                records.append(_rec(case, dev, PASS_MODES[mode], *fs))
    z = by_name(zoo_matrix(typed(records), 2))[row.name]
    assert z.recall == (len(row.expected), len(row.expected)) and z.unexpected == []


RACE_ROW = row_named("read before its barrier")
TWO_ROW = row_named("loss in HWC: alphas never written")
LAYOUT_ROW = row_named("reads the saved permuted image")
CONVENTION_ROW = row_named("radius 0 (the convention)")
RACECHECK = "sanitizer:racecheck"


def test_the_new_kinds_have_rows_with_clean_twins():
    kinds = {e.kind for r in ZOO for e in r.expected}
    assert {"unwritten-output", "memory-layout", "data-race"} <= kinds
    assert len({e.kind for e in TWO_ROW.expected}) == 2
    assert [e.mode for e in RACE_ROW.expected] == [RACECHECK]
    assert RACECHECK in selftest.SANITIZER_MODES
    twins = {c for r in ZOO if not r.expected for c in r.cases}
    assert {
        "zoo/test_zoo_raster.py::test_raster_clean_mask_train",
        "zoo/test_zoo_raster.py::test_project_clean_determinism",
        "zoo/test_zoo_ssim.py::test_ssim_clean_permuted_grad",
        "zoo/test_zoo_ssim.py::test_ssim_clean_sanitized_train",
    } <= twins


def test_the_race_is_judged_in_the_racecheck_passes_only():
    case = RACE_ROW.cases[0]
    op = "gpucheck_zoo_ssim_nosync.fusedssim_backward"
    skipped = [_rec(case, "cuda:0", PLAIN, status="skipped")]
    z = _judge(skipped, 1)[RACE_ROW.name]
    assert z.recall == (0, 0) and [why for _, why in z.not_run] == [
        "no sanitizer:racecheck pass in this run"
    ]
    # both arrangements of the pass: the data race on the op, the raw records and the failed
    # assert its symptoms
    found = skipped + [
        _rec(
            case,
            "cuda:0",
            mode,
            _finding("data-race", "cuda:0", op=op),
            _finding("sanitizer", "cuda:0", kernel="ssim_backward_kernel"),
            _finding("test-failure", "cuda:0"),
            status="failed",
        )
        for mode in (RACECHECK, f"{RACECHECK}|target-current")
    ]
    z = _judge(found, 1)[RACE_ROW.name]
    assert z.recall == (1, 1) and z.unexpected == []
    # a race named only by its kernel (no op) in one arrangement is a miss there
    found[2]["findings"] = [_finding("sanitizer", "cuda:0", kernel="ssim_backward_kernel")]
    z = _judge(found, 1)[RACE_ROW.name]
    assert z.recall == (0, 1) and [u["kind"] for u in z.unexpected] == ["sanitizer"]


def test_unwritten_alphas_and_a_contiguous_read_in_one_case():
    case = TWO_ROW.cases[0]
    mod = "gpucheck_zoo_raster_unwritten_assume_contiguous"
    unwritten = _finding("unwritten-output", "cuda:0", op=f"{mod}.rasterize_gaussians")
    layout = _finding("memory-layout", "cuda:0", op=f"{mod}.rasterize_gaussians_backward")
    failure = _finding("test-failure", "cuda:0")
    z = _judge([_rec(case, "cuda:0", PLAIN, unwritten, layout, failure, status="failed")], 1)
    assert z[TWO_ROW.name].recall == (2, 2) and z[TWO_ROW.name].unexpected == []
    z = _judge([_rec(case, "cuda:0", PLAIN, unwritten, failure, status="failed")], 1)
    assert z[TWO_ROW.name].recall == (1, 2)
    assert [e.kind for e, _ in z[TWO_ROW.name].missed] == ["memory-layout"]


def test_the_layout_finding_must_name_the_backward():
    case = LAYOUT_ROW.cases[0]
    mod = "gpucheck_zoo_ssim_assume_contiguous"
    records = [
        _rec(
            case,
            "cuda:0",
            PLAIN,
            _finding("memory-layout", "cuda:0", op=f"{mod}.fusedssim_backward"),
            _finding("memory-layout", "cuda:0", op=f"{mod}.fusedssim"),  # the forward copies
            _finding("test-failure", "cuda:0"),
            status="failed",
        )
    ]
    z = _judge(records, 1)[LAYOUT_ROW.name]
    assert z.recall == (1, 1)
    assert [(u["kind"], u["op"]) for u in z.unexpected] == [("memory-layout", f"{mod}.fusedssim")]


@pytest.mark.parametrize(
    ("finding", "unexpected"),
    [
        (_finding("unwritten-output", "cuda:0", "info", op="gpucheck_zoo_raster_clean"), []),
        (
            _finding("unwritten-output", "cuda:0", op="gpucheck_zoo_raster_clean"),
            ["unwritten-output"],
        ),
        (_finding("numerics", "cuda:0", op="gpucheck_zoo_raster_clean"), ["numerics"]),
    ],
    ids=["a note", "an error", "non-deterministic"],
)
def test_the_projections_convention_allows_a_note_at_most(finding, unexpected):
    case = CONVENTION_ROW.cases[0]
    z = _judge([_rec(case, "cuda:0", PLAIN, finding)], 1)[CONVENTION_ROW.name]
    assert [u["kind"] for u in z.unexpected] == unexpected and z.ran


def test_the_recorded_two_gpu_zoo_run_finds_every_row_and_nothing_else():
    """The run recorded on 2x H200: every expectation found, no unexpected finding; among
    them the zoo's first failure (no guard + stream 0): the case aborted or faulted with
    the other device current, so its stream findings come from the re-run, carried to it."""
    from pathlib import Path

    from gpucheck import selftest

    run = Path(__file__).parents[1] / "fixtures" / "run_h200x2_zoo"
    cases, devices = selftest.read_run(run)
    assert devices == 2
    zoo = selftest.zoo_matrix(cases, devices)
    assert [(z.row.name, z.unexpected, z.missed) for z in zoo if z.unexpected or z.missed] == []
    assert sum(z.recall[0] for z in zoo) == sum(z.recall[1] for z in zoo) == 24
    rows, false = selftest.matrix(cases, devices)
    assert false == [] and not [r for r in rows if r.status == "missed"]
    knn = [
        r
        for r in cases
        if r.case.startswith("zoo/test_zoo_knn.py::test_knn_noguard_thrust0")
        and r.mode == "blocking+nvml"
    ]
    assert len(knn) == 2
    for r in knn:
        assert r.status in ("failed", "crashed")
        kinds = {f.kind: f for f in r.findings}
        assert "wrong-device" in kinds and "wrong-stream" in kinds
        assert kinds["wrong-stream"].evidence.startswith("seen in the wrong-device check's re-run")
