"""check_op on CPU: its cases, its error messages, and every check's logic run on CPU tensors
(torch.library ops and plain functions), the findings each broken op gives."""

from __future__ import annotations

import pytest
import torch
from clirun import gpucheck

from gpucheck import check_op
from gpucheck.check import run_check
from gpucheck.detectors import op_watch
from gpucheck.worker import case as worker_case

CPU = torch.device("cpu")


def make(device, dtype):
    return (
        torch.randn(5, 33, device=device, dtype=dtype),
        torch.rand(33, device=device, dtype=dtype) + 0.5,
    )


def reference(x, w):
    return (x.double() * w.double()).cumsum(-1).to(x.dtype)  # exact, rounded once


def scan(x, w):
    """float32 accumulation, as a good kernel does it; refuses float16."""
    if x.dtype == torch.float16:
        raise TypeError("scan: x must be float32, float64 or bfloat16, got Half")
    acc = torch.promote_types(x.dtype, torch.float32)
    return (x.to(acc) * w.to(acc)).cumsum(-1).to(x.dtype)


def scan_low_precision(x, w):
    """Accumulates in the input dtype: bfloat16 loses bits at every step."""
    if x.dtype == torch.float16:
        raise TypeError("got Half")
    out, acc = torch.empty_like(x), torch.zeros_like(x[..., 0])
    for t in range(x.shape[-1]):
        acc = acc + x[..., t] * w[t]
        out[..., t] = acc
    return out


@torch.library.custom_op("gpucheck_cpu_test::scan", mutates_args=())
def scan_op(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return scan(x, w)


@scan_op.register_fake
def _(x, w):
    return torch.empty_like(x)


def _scan_backward(ctx, g):
    x, w = ctx.saved_tensors
    gs = g.flip(-1).cumsum(-1).flip(-1)
    return gs * w, (gs * x).sum(0)


scan_op.register_autograd(
    _scan_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs)
)

DTYPES = ("float32", "bfloat16", "float64")


def run_all(test, *, seed=7):
    """{case: (outcome, [(kind, op, message)])} of every case of a check_op test on CPU."""
    out = {}
    for case in test.gpucheck_op.checks:
        worker_case.STATE.attached.clear()
        try:
            run_check(test.gpucheck_op, case, CPU, None, seed)
            outcome = "passed"
        except pytest.skip.Exception as err:
            outcome = f"skipped: {err}"
        except AssertionError as err:
            outcome = f"failed: {err}"
        out[case] = (outcome, [(f.kind, f.op, f.message) for f in worker_case.STATE.attached])
    worker_case.STATE.attached.clear()
    return out


# --- the cases -----------------------------------------------------------------------------


def test_cases_per_dtype_and_per_op():
    t = check_op(torch.ops.gpucheck_cpu_test.scan, make, reference, dtypes=DTYPES)
    per_dtype = ["devices", "numerics", "determinism", "cross_device", "memory"]
    assert t.gpucheck_op.checks == (
        *(f"{c}-{d}" for d in DTYPES for c in per_dtype),
        "dtypes",
        "opcheck",
        "gradcheck",
    )
    assert t.gpucheck_op.name == "gpucheck_cpu_test::scan" and t.gpucheck_op.torch_op
    # a plain function: no opcheck; no reference: no numerics; no float64: no gradcheck
    t = check_op(scan, make, dtypes=("float32",))
    assert t.gpucheck_op.checks == (
        "devices-float32",
        "determinism-float32",
        "cross_device-float32",
        "memory-float32",
        "dtypes",
    )
    assert t.gpucheck_op.name == f"{__name__}.scan" and not t.gpucheck_op.torch_op
    t = check_op(
        scan, make, reference, dtypes=DTYPES, backward=False, checks=("numerics", "gradcheck")
    )
    assert t.gpucheck_op.checks == ("numerics-float32", "numerics-bfloat16", "numerics-float64")


def test_a_users_file_collects_one_case_per_device_and_check(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(
        test_mine="""
        import torch, gpucheck
        def make(device, dtype):
            return (torch.randn(8, device=device, dtype=dtype),)
        test_neg = gpucheck.check_op(torch.neg, make, lambda x: -x, dtypes=("float32", "float64"))
    """
    )
    result = pytester.runpytest_subprocess("--strict-markers", "-rs", "-m", "gpu")
    # without a GPU: devices-* and numerics-* check the suite itself; the rest wait for one
    result.assert_outcomes(passed=4, skipped=8)
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]8[]] *: waits for a GPU: this check runs the op on a CUDA device*"]
    )
    ids = pytester.runpytest_subprocess("--collect-only", "-q", "-m", "multigpu").outlines
    assert [i for i in ids if "::" in i] == [
        "test_mine.py::test_neg[cpu-cross_device-float32]",
        "test_mine.py::test_neg[cpu-cross_device-float64]",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtypes": ("float32", "int32")}, "dtypes must name floating dtypes"),
        ({"dtypes": ()}, "dtypes must name floating dtypes"),
        ({"checks": ("numerics", "speed")}, r"unknown check\(s\) \['speed'\]"),
        ({"repeats": 1}, "repeats must be at least 2, got 1"),
        ({"atol": {"float8": 1.0}}, r"tolerances for unknown dtype\(s\) \['float8'\]"),
        ({"devices": "cuda:0"}, "devices must be 'all' or CUDA indices"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_op(scan, make, reference, **kwargs)


def test_op_and_make_inputs_must_be_callable():
    with pytest.raises(TypeError, match="op must be callable"):
        check_op(42, make)
    with pytest.raises(TypeError, match="make_inputs must be callable"):
        check_op(scan, None)


# --- the checks, on CPU ---------------------------------------------------------------------


def test_a_correct_torch_op_passes_every_check_that_runs_on_cpu():
    got = run_all(check_op(torch.ops.gpucheck_cpu_test.scan, make, reference, dtypes=DTYPES))
    for case, (outcome, found) in got.items():
        if case.startswith(("cross_device", "memory")):
            assert outcome.startswith("skipped"), (case, outcome)
        else:
            assert outcome == "passed" and not found, (case, outcome, found)


def test_a_correct_plain_function_passes_and_refuses_float16_cleanly():
    got = run_all(check_op(scan, make, reference, dtypes=DTYPES))
    assert got["dtypes"] == ("passed", [])
    assert all(
        o == "passed" for c, (o, _) in got.items() if not c.startswith(("cross_device", "memory"))
    )


def test_low_precision_accumulation_fails_numerics_in_bfloat16_only():
    got = run_all(check_op(scan_low_precision, make, reference, dtypes=DTYPES))
    outcome, found = got["numerics-bfloat16"]
    assert outcome.startswith("failed:") and "2 x the reference's own bfloat16 error" in outcome
    assert "GPUCHECK_SEED=7" in outcome
    assert found and {(k, op) for k, op, _ in found} == {
        ("numerics", f"{__name__}.scan_low_precision")
    }
    assert got["numerics-float32"][0] == "passed"  # float32 accumulates in float32 anyway
    assert got["numerics-float64"][0] == "passed"


def test_a_wrong_gradient_fails_numerics_and_gradcheck():
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).sum(0)  # forgets that y[t] depends on every x[s <= t]

    @torch.library.custom_op("gpucheck_cpu_test::bad_scan", mutates_args=())
    def bad(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return scan(x, w)

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    bad.register_autograd(backward, setup_context=setup)
    bad.register_fake(lambda x, w: torch.empty_like(x))
    got = run_all(
        check_op(
            torch.ops.gpucheck_cpu_test.bad_scan,
            make,
            reference,
            dtypes=("float64",),
            checks=("numerics", "gradcheck"),
        )
    )
    assert "gradient of argument 0" in got["numerics-float64"][0]
    assert got["gradcheck"][0].startswith("failed:")


def test_outputs_and_gradients_on_another_device_are_wrong_device_findings():
    class ToMeta(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return torch.empty(g.shape, device="meta")  # a gradient on another device

    def meta_out(x):
        return torch.empty(x.shape, device="meta")

    def one(device, dtype):
        return (torch.randn(7, device=device, dtype=dtype),)

    got = run_all(check_op(ToMeta.apply, one, dtypes=("float32",), checks=("devices",)))
    outcome, found = got["devices-float32"]
    assert "backward returned the gradient 0 on meta, its input is on cpu" in outcome
    assert [k for k, _, _ in found] == ["wrong-device"]
    got = run_all(
        check_op(
            meta_out, one, dtypes=("float32",), backward=False, checks=("devices",), name="meta_out"
        )
    )
    assert got["devices-float32"][1] == [
        ("wrong-device", "meta_out", "meta_out: output 0 is on meta, its inputs on cpu")
    ]


def test_non_determinism_is_a_numerics_finding():
    calls = []

    def drifting(x):
        calls.append(1)
        return x + len(calls) * 1e-3

    got = run_all(
        check_op(
            drifting,
            lambda d, t: (torch.ones(4, dtype=t, device=d),),
            dtypes=("float32",),
            backward=False,
            checks=("determinism",),
        )
    )
    outcome, found = got["determinism-float32"]
    assert "non-deterministic: call 2 differs from call 1" in outcome
    assert [k for k, _, _ in found] == ["numerics"]
    got = run_all(
        check_op(
            drifting,
            lambda d, t: (torch.ones(4, dtype=t, device=d),),
            dtypes=("float32",),
            deterministic=False,
            checks=("determinism",),
        )
    )
    assert got["determinism-float32"][0].startswith("skipped")


def test_backward_without_autograd_says_so():
    got = run_all(
        check_op(
            lambda x: x.detach() * 2,
            lambda d, t: (torch.ones(3, dtype=t),),
            dtypes=("float32",),
            checks=("devices",),
        )
    )
    assert "no output requires grad" in got["devices-float32"][0]


def test_plain_functions_are_shown_to_the_op_watch_under_their_name():
    seen = []

    class Listener:
        def before(self, call):
            seen.append(call.op)

        def after(self, call, out):
            pass

    listener = Listener()
    op_watch.add(listener)
    try:
        run_all(check_op(scan, make, reference, dtypes=("float32",), checks=("numerics",)))
    finally:
        op_watch.remove(listener)
    assert seen == [f"{__name__}.scan"]


def test_inputs_are_the_same_for_one_seed_and_fresh_for_another():
    t = check_op(scan, make, dtypes=("float32",))
    from gpucheck.check import Runner

    a = Runner(t.gpucheck_op, 3).inputs(CPU, torch.float32)
    b = Runner(t.gpucheck_op, 3).inputs(CPU, torch.float32)
    c = Runner(t.gpucheck_op, 4).inputs(CPU, torch.float32)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_the_example_extension_is_compile_checked_clean_and_with_each_defect():
    from gpucheck._csrc import compile_check
    from gpucheck._csrc import sources as kernel_sources

    names = {f.name for f in compile_check.check_only_sources() if "custom_rnn" in str(f)}
    assert names == {"bindings.cpp", "wkv.cpp", "wkv_cuda.cu"}
    units, _ = compile_check.check_units("only")
    variants = {(f.name, tuple(flags)) for f, flags, label in units if "example" in label}
    assert variants == {
        ("wkv.cpp", ("-DCUSTOM_RNN_DEFECT_NO_GUARD",)),
        ("wkv.cpp", ("-DCUSTOM_RNN_DEFECT_BF16_ACCUM",)),
        ("wkv_cuda.cu", ("-DCUSTOM_RNN_DEFECT_BF16_ACCUM",)),
        ("wkv.cpp", ("-DCUSTOM_RNN_DEFECT_GRAD_CURRENT_DEVICE",)),
    }
    code = "".join(
        (kernel_sources.example_csrc_dir() / n).read_text() for n in ("wkv.h", "wkv.cpp")
    )
    for _, flags in variants:  # every macro is one the sources test
        assert f"#ifdef {flags[0].removeprefix('-D')}" in code


# --- without a GPU: the dry run of the suite itself (gpucheck.check.cpu) --------------------


def _dry(test, *, seed=7):
    """{case: outcome} of every case of a check_op test run as without a GPU."""
    from gpucheck.check.cpu import dry_run

    out = {}
    for case in test.gpucheck_op.checks:
        try:
            dry_run(test.gpucheck_op, case, seed)
            out[case] = "passed"
        except pytest.skip.Exception as err:
            out[case] = f"skipped: {err}"
        except AssertionError as err:
            out[case] = f"failed: {err}"
    return out


def _line(fn, text):
    """The line of this file where ``text`` is, inside ``fn``'s source."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_without_a_gpu_a_sound_suite_checks_its_inputs_and_reference_and_waits_for_the_rest():
    from gpucheck.check.cpu import WAITS

    got = _dry(check_op(scan, make, reference, dtypes=DTYPES))
    assert {c: o for c, o in got.items() if o == "passed"} == {
        f"{c}-{d}": "passed" for d in DTYPES for c in ("devices", "numerics")
    }
    assert {o for c, o in got.items() if o != "passed"} == {f"skipped: {WAITS}"}


def _wrong_dim(x, w):
    return (x * w).cumsum(2)  # the inputs have two dimensions


def _random(x, w):
    return (x * w).cumsum(-1) + 1e-3 * torch.rand_like(x)


def _hard_coded_dtype(device, dtype):
    return (
        torch.randn(5, 33, device=device, dtype=torch.float32),
        torch.rand(33, device=device, dtype=dtype) + 0.5,
    )


def _zeros(device, dtype):
    return (
        torch.zeros(5, 33, device=device, dtype=dtype),
        torch.rand(33, device=device, dtype=dtype) + 0.5,
    )


@pytest.mark.parametrize(
    ("inputs", "ref", "kwargs", "case", "said"),
    [
        (
            make,
            _wrong_dim,
            {},
            "numerics-float32",
            "the reference, run in float64, raised IndexError: Dimension out of range",
        ),
        (
            make,
            _random,
            {},
            "numerics-float32",
            "gives other results when called twice on the same input",
        ),
        (
            make,
            reference,
            {"rtol": 0.0, "atol": 0.0},
            "numerics-float32",
            "itself, run in float32, is off from its float64 result by more than rtol=0, atol=0",
        ),
        (
            _hard_coded_dtype,
            reference,
            {},
            "devices-float64",
            "argument 0 is float32, not the dtype asked for (float64)",
        ),
        (_zeros, reference, {}, "devices-float32", "argument 0 is all zeros"),
    ],
)
def test_without_a_gpu_a_broken_suite_fails_naming_the_users_file_and_line(
    inputs, ref, kwargs, case, said
):
    got = _dry(check_op(scan, inputs, ref, dtypes=("float32", "float64"), **kwargs))
    assert got[case].startswith("failed: "), got
    assert said in got[case]
    import os

    blamed = ref if case.startswith("numerics") else inputs
    here = os.path.relpath(__file__)  # as check.cpu.where shows it: relative to the cwd
    here = os.path.abspath(__file__) if here.startswith("..") else here
    if ref is _wrong_dim:  # an exception: the line that raised it
        assert f"at {here}:{_line(_wrong_dim, 'cumsum(2)')}" in got[case]
    else:  # the function at fault, where it is defined
        import inspect

        assert f"{here}:{inspect.getsourcelines(blamed)[1]}" in got[case]
    others = {c: o for c, o in got.items() if c != case and o.startswith("failed")}
    assert all(c.startswith(case.split("-")[0]) or c.startswith("numerics") for c in others)


def _make_3d(device, dtype):
    return (torch.randn(3, 97, 67, device=device, dtype=dtype),)


def _float32_inside(x):
    return x.float().cumsum(1).to(x.dtype)  # float64 inputs summed in float32


def _promoted(x):
    return x.to(torch.promote_types(x.dtype, torch.float32)).cumsum(1).to(x.dtype)


def _float32_mask(x):
    return torch.where(x.float() > 0, x, -x).cumsum(1)  # a cast that changes no value


def _cumsum_op(x):
    raise RuntimeError("a CUDA kernel: never called without a GPU")


@pytest.mark.parametrize("ref", [_promoted, _float32_mask])
def test_without_a_gpu_a_reference_as_accurate_as_its_dtype_passes(ref):
    got = _dry(check_op(_cumsum_op, _make_3d, ref, dtypes=("float32", "bfloat16", "float64")))
    assert all(got[f"{c}-{d}"] == "passed" for c in ("devices", "numerics") for d in DTYPES), got


def test_without_a_gpu_a_float64_reference_computed_in_float32_is_named_in_one_sentence():
    """docs/check_op.md's example once: float64 claimed, a reference that sums in float32.
    Its float64 result is off from itself computed in float64 by ~1e-6, where float64's
    tolerance allows 1e-7: no correct float64 kernel passes against it."""
    got = _dry(check_op(_cumsum_op, _make_3d, _float32_inside, dtypes=DTYPES))
    assert got["numerics-float32"] == got["numerics-bfloat16"] == "passed"  # float32 is claimed
    said = got["numerics-float64"]
    import inspect
    import os

    here = os.path.relpath(__file__)
    here = os.path.abspath(__file__) if here.startswith("..") else here
    line = inspect.getsourcelines(_float32_inside)[1]
    assert said.startswith(
        f"failed: test_check_op._cumsum_op: the reference ({here}:{line}), run in float64, "
        "computes in "
        "float32 inside, so it is only float32-accurate (off from itself computed in "
        "float64 by more than rtol=1e-07, atol=1e-07: "
    ), said
    assert "a correct float64 kernel fails numerics-float64 against it" in said
    assert "\n" not in said


USER_SUITE = """
import torch

import gpucheck


def scan(x):  # stands in for a CUDA kernel: never called without a GPU
    raise RuntimeError("a CUDA kernel")


def make_inputs(device, dtype):
    return (torch.randn(3, 97, 67, device=device, dtype=dtype),)


def reference(x):
    return x.cumsum(1){wrong}


test_scan = gpucheck.check_op(scan, make_inputs, reference=reference,
                              dtypes=("float32", "bfloat16"))
"""


@pytest.mark.parametrize("wrong", ["", ".sum(3)"])
def test_gpucheck_run_cpu_only_dry_runs_a_users_check_op_suite(tmp_path, wrong):
    import json

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_my_ext.py").write_text(USER_SUITE.format(wrong=wrong))
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--suite",
        "tests/test_my_ext.py",
        "--out",
        "out",
        cwd=tmp_path,
        timeout=300,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    last = proc.stdout.strip().splitlines()[-1]
    assert "7 skipped: waits for a GPU: this check runs the op on a CUDA device" in last
    recs = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").open()]
    failed = [r for r in recs if r.get("status") == "failed"]
    if not wrong:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert last.startswith("passed (exit 0): 11 case(s): 4 ran (4 passed, 0 failed)")
        assert not failed
        return
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert {r["case"] for r in failed} == {
        "test_my_ext.py::test_scan[cpu-numerics-float32]",
        "test_my_ext.py::test_scan[cpu-numerics-bfloat16]",
    }
    line = USER_SUITE.splitlines().index("    return x.cumsum(1){wrong}") + 1
    for r in failed:
        assert "raised IndexError: Dimension out of range" in r["reason"]
        assert f"at tests/test_my_ext.py:{line}" in r["reason"]  # the user's file, not ours
