"""Comparisons for suites whose failures should say *how far off* a kernel is.

``gpucheck.testing.assert_close(got, want, rtol=..., atol=..., what=...)`` checks like
``torch.testing.assert_close`` (``|got - want| <= atol + rtol * |want|`` elementwise, NaN
only where the reference has NaN, same shape) and measures the errors in float64: the
largest absolute and relative error, where it is, how many elements are out of tolerance.
Under the harness the measurement goes to the ``numerics`` detector: a failed comparison is
a ``numerics`` finding carrying those numbers, and every comparison (passed or not) is kept
in the case record (``numerics``), so a report shows how close each check came to its
tolerance. Without the harness it is a plain assertion with a measured message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpucheck.model.numerics import Measured

#: comparisons of the case under way, drained by the numerics detector
MEASURED: list[Measured] = []
MAX_KEPT = 32


def measure(got: Any, want: Any, *, rtol: float, atol: float, what: str = "result") -> Measured:
    """Compare ``got`` with the reference ``want`` (tensors of one shape, any devices and
    floating dtypes) in float64 on ``want``'s device."""
    import torch

    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(
            f"{what}: shape {tuple(got.shape)} differs from the reference's {tuple(want.shape)}"
        )
    g = got.detach().to(device=want.device, dtype=torch.float64)
    w = want.detach().to(torch.float64)
    nan_g, nan_w = torch.isnan(g), torch.isnan(w)
    nan_bad = nan_g != nan_w
    both_nan = nan_g & nan_w
    diff = (g - w).abs()
    same_inf = torch.isinf(w) & (g == w)
    diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
    diff = torch.where(nan_bad, torch.full_like(diff, float("inf")), diff)
    allowed = atol + rtol * w.abs()
    bad = (diff > allowed) | nan_bad
    rel = diff / w.abs().clamp_min(torch.finfo(torch.float64).tiny)
    rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
    n_bad = int(bad.sum())
    worst = None
    if g.numel():
        score = torch.where(bad, diff - allowed, torch.full_like(diff, -float("inf")))
        flat = int(torch.argmax(score if n_bad else diff))
        worst = [int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(g.shape))]
    at = tuple(worst) if worst is not None else None
    return Measured(
        what=what,
        ok=n_bad == 0,
        shape=list(g.shape),
        dtype=str(got.dtype).removeprefix("torch."),
        rtol=float(rtol),
        atol=float(atol),
        max_abs=float(diff.max()) if g.numel() else 0.0,
        max_rel=float(rel.max()) if g.numel() else 0.0,
        worst_index=worst,
        got_at_worst=float(g[at]) if at is not None else None,
        want_at_worst=float(w[at]) if at is not None else None,
        mismatched=n_bad,
        total=int(g.numel()),
        nan_mismatch=int(nan_bad.sum()),
    )


def assert_close(
    got: Any, want: Any, *, rtol: float, atol: float, what: str = "result"
) -> Measured:
    """Assert ``got`` matches the reference ``want`` within ``atol + rtol * |want|``; the
    measured errors go to the numerics detector (see the module text). Returns them."""
    m = measure(got, want, rtol=rtol, atol=atol, what=what)
    if len(MEASURED) < MAX_KEPT or not m.ok:
        MEASURED.append(m)
    if not m.ok:
        raise AssertionError(m.message())
    return m


#: the floating dtypes a dtype-coverage check tries by default
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass
class DtypeOutcome:
    dtype: str
    claimed: bool  # the op claims to support it
    outcome: str  # "ran" | "rejected" | "wrong-error" | "accepted" | "bad-result"
    detail: str


#: how torch's own messages name a dtype, besides its name (``Half`` for float16)
_DTYPE_WORDS = {"float16": "Half", "bfloat16": "BFloat16", "float64": "Double"}


def _dtype_outcome(
    run: Any, make_inputs: Any, name: str, supported: tuple[str, ...]
) -> DtypeOutcome:
    """How ``run(*make_inputs(dtype))`` treats the dtype ``name``: for one it claims
    (``supported``), ran with finite results or not; for any other, rejected with an error
    that names the dtype, or not."""
    import torch

    dtype = getattr(torch, name)
    claimed = name in supported
    try:
        out = run(*make_inputs(dtype))
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as err:
        said = str(err)
        msg = said.split("\n", 1)[0]
        if claimed:
            return DtypeOutcome(name, True, "wrong-error", f"raised: {msg}")
        words = {name, str(dtype), name.replace("float", "Float"), _DTYPE_WORDS.get(name, name)}
        if any(w in said for w in words):
            return DtypeOutcome(name, False, "rejected", msg)
        return DtypeOutcome(name, False, "wrong-error", f"error does not name {name}: {msg}")
    if not claimed:
        return DtypeOutcome(
            name,
            False,
            "accepted",
            f"accepted {name} although it claims {', '.join(supported)} only",
        )
    tensors = [
        t
        for t in (out if isinstance(out, (tuple, list)) else (out,))
        if isinstance(t, torch.Tensor)
    ]
    finite = all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())
    return DtypeOutcome(
        name, True, "ran" if finite else "bad-result", "" if finite else "non-finite output"
    )


def check_dtypes(
    run: Any,
    make_inputs: Any,
    supported: tuple[str, ...],
    *,
    dtypes: tuple[str, ...] = FLOAT_DTYPES,
    what: str = "op",
) -> list[DtypeOutcome]:
    """Dtype coverage of an op: ``run(*make_inputs(dtype))`` must work and give finite
    results for every dtype in ``supported``, and raise an error that names the dtype for
    every other one (a ``TypeError``/``ValueError``/``RuntimeError`` whose message contains
    it, not a crash or a silent cast). Raises AssertionError listing every dtype that broke
    the rule (and reports it as a ``numerics`` finding under the harness); returns the
    outcome per dtype."""
    outcomes = [_dtype_outcome(run, make_inputs, name, supported) for name in dtypes]
    broken = [o for o in outcomes if o.outcome not in ("ran", "rejected")]
    m = Measured(
        what=f"{what}: dtype coverage",
        ok=not broken,
        shape=[],
        dtype="",
        rtol=0.0,
        atol=0.0,
        max_abs=0.0,
        max_rel=0.0,
        worst_index=None,
        got_at_worst=None,
        want_at_worst=None,
        mismatched=len(broken),
        total=len(outcomes),
        nan_mismatch=0,
    )
    if len(MEASURED) < MAX_KEPT or broken:
        MEASURED.append(m)
    if broken:
        text = "; ".join(f"{o.dtype}: {o.outcome} ({o.detail})" for o in broken)
        m.what = f"{what}: dtype coverage broken for {text}"
        raise AssertionError(m.what)
    return outcomes
