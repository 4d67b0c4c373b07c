"""checkpoint-reads: every 3DGS checkpoint a case reads is linted, whether or not it renders.

Worker side. A case that reads a checkpoint saved *activated* and renders it passes silently
whenever the GPU is large enough (failure 3 of ``docs/failures.md``: 17 GB for 200k Gaussians
whose raw file needs ~50 MB). While the body of a case runs, this detector wraps the readers
3DGS code uses, ``plyfile.PlyData.read`` (``GaussianModel.load_ply``) and ``torch.load`` /
``torch.serialization.load`` (``train.py``'s ``--start_checkpoint``), given a path or an open
file with a ``.name``. Each file whose content holds 3DGS parameters (a PLY ``vertex``
element with 3DGS's properties; a ``.pt`` dict with log-scales or opacity logits under our or
3DGS's names, or a ``(capture, iteration)`` tuple) is linted once per case with
:func:`gpucheck.checkpoints.lint.lint`: an ``activated`` file is a ``double-activation`` error
naming the file and the activated fields, with the lint's evidence and fix; a ``suspicious``
one (NaN/inf, mostly positive log-scales) a ``checkpoint-suspicious`` warning.

Nothing for anything else: another ``torch.load`` (model weights, optimizer state), a point
cloud PLY (COLMAP's ``points3D.ply``), a stream without a file name, a file the lint cannot
read (the case's own business), and reads inside the lint itself (its own reads of the file,
and a case that lints a file on purpose) or inside ``check_roundtrip`` (the
``double-activation`` detector judges those).

Cost: the wrappers are put in place when the body starts and the originals back when it ends,
for ``plyfile`` and ``torch`` only if they are imported (a module a case imports during its
body is wrapped as its import finishes): 7 us a case that reads no checkpoint. A read that
returns anything but 3DGS parameters pays one key or property lookup (a ``state_dict``'s
``torch.load`` is no slower). A checkpoint is read again by the lint (PLYs memory-mapped, a
block of rows at a time), once per worker for the same path, size and mtime; measured on 2
shared CPU cores for 1M Gaussians, that adds 0.3 to 0.4 s to the first read of a PLY (SH
degree 0 or 3; ``gpucheck.checkpoints.load`` of the same file takes 1.1 to 2.6 s, a bare
``PlyData.read`` 1 ms since it maps the file) and 0.4 to 1.5 s to a ``.pt`` (``torch.load``:
0.06 to 0.1 s); a later read of the same file, in that case or a later one, adds no
measurable time (a stack walk and a stat: a bare ``PlyData.read`` takes 0.3 ms).
``GPUCHECK_DISABLE_DETECTORS=checkpoint-reads`` turns it off.

Not seen: reads in fixtures (only the body of a case is watched), readers bound before the
case (``from torch import load``), and files read in other processes (DataLoader workers).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

from gpucheck.detectors.base import BaseDetector, CaseInfo
from gpucheck.model.kinds import Kind
from gpucheck.model.results import Finding

if TYPE_CHECKING:
    from gpucheck.checkpoints.lint import LintReport

__all__ = ["JUDGED_ELSEWHERE", "CheckpointReads"]

#: reads made inside these modules are judged there: the lint (its own reads, and cases that
#: lint files on purpose) and ``check_roundtrip`` (the double-activation detector)
JUDGED_ELSEWHERE = frozenset({"gpucheck.checkpoints.lint", "gpucheck.checkpoints.roundtrip"})
#: frames of these modules are the reader, not the code that asked for the read
_READERS = ("plyfile", "torch", "gpucheck.checkpoints", "gpucheck.detectors")
_WATCHED = ("plyfile", "torch")

Key = tuple[str, int, int]  # real path, size, mtime (ns)


@dataclasses.dataclass
class _Read:
    """One distinct checkpoint file a case read, and the lint of it."""

    path: str
    via: str  # "plyfile.PlyData.read" or "torch.load"
    where: str | None  # file:line of the code that read it
    report: LintReport


def _ply_holds_params(data: Any) -> bool:
    """A ``PlyData`` whose ``vertex`` element has every 3DGS property (header only)."""
    from gpucheck.checkpoints.layout import SCALAR_FIELDS

    try:
        vertex = data["vertex"]
        names = {p.name for p in vertex.properties}
    except (KeyError, TypeError, AttributeError):
        return False
    return set(SCALAR_FIELDS) <= names


def _pt_holds_params(obj: Any) -> bool:
    """What ``torch.load`` returned looks like a 3DGS checkpoint (either .pt form)."""
    from gpucheck.checkpoints.pt import ATTRIBUTE_NAMES, CAPTURE_FIELDS

    if isinstance(obj, dict):
        judged = ("log_scales", "opacity_logits")
        return any(k in obj for name in judged for k in (name, ATTRIBUTE_NAMES[name]))
    return (
        isinstance(obj, tuple | list)
        and len(obj) == 2
        and isinstance(obj[0], tuple | list)
        and len(obj[0]) == len(CAPTURE_FIELDS)
    )


def _path_of(source: Any) -> str | None:
    """The file a reader was given: a path, or an open file's ``.name``."""
    if isinstance(source, str | bytes | os.PathLike):
        return os.fsdecode(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else None


def _caller(frame: FrameType | None) -> tuple[bool, str | None]:
    """(whether a module of JUDGED_ELSEWHERE is on the stack, the innermost frame outside
    the readers as ``file:line``)."""
    where = None
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module in JUDGED_ELSEWHERE:
            return True, None
        if where is None and not module.startswith(_READERS):
            where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return False, where


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Wraps a watched module's readers as soon as a case imports it during its body."""

    def __init__(self, names: Sequence[str], patch: Callable[[str, ModuleType], None]) -> None:
        self.names = set(names)
        self.patch = patch
        self._finding = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names or getattr(self._finding, "on", False):
            return None
        self._finding.on = True  # the other finders find it; this one steps aside
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.on = False
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        run = loader.exec_module

        def exec_then_patch(module: ModuleType) -> None:
            try:
                run(module)
            finally:
                vars(loader).pop("exec_module", None)
            self.patch(fullname, module)

        try:
            loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        except AttributeError:  # a loader without an instance dict: leave it alone
            return None
        return spec


#: a checkpoint a case read whose parameters look neither raw nor activated
CHECKPOINT_SUSPICIOUS = Kind("checkpoint-suspicious")


class CheckpointReads(BaseDetector):
    """Lints the 3DGS checkpoints a case reads through plyfile or ``torch.load``."""

    name = "checkpoint-reads"
    kinds = (CHECKPOINT_SUSPICIOUS,)
    touches_gpu = False  # what it saw of the calls before an error stands

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[Key, LintReport] = {}  # across the worker's cases
        self._reads: dict[Key, _Read] = {}  # this case's distinct checkpoint files
        self._errors: list[str] = []
        self._undo: list[Callable[[], None]] = []
        self._watch: _ImportWatch | None = None

    def case_started(self, case: CaseInfo) -> None:
        self._restore()  # a case whose start failed half-way was never finished
        self._reads, self._errors = {}, []
        missing = [name for name in _WATCHED if name not in sys.modules]
        for name in _WATCHED:
            if name not in missing:
                self._patch(name, sys.modules[name])
        if missing:
            self._watch = _ImportWatch(missing, self._patch)
            sys.meta_path.insert(0, self._watch)

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        self._restore()
        with self._lock:
            reads, errors, self._reads, self._errors = (
                list(self._reads.values()),
                self._errors,
                {},
                [],
            )
        found = [f for r in reads if (f := _finding(r, case)) is not None]
        found += [
            case.finding("detector-error", "warning", f"detector {self.name} failed: {e}")
            for e in errors
        ]
        return found

    # --- the wrappers ---------------------------------------------------------------------

    def _restore(self) -> None:
        """The original readers back, the import watch gone."""
        if self._watch is not None:
            if self._watch in sys.meta_path:
                sys.meta_path.remove(self._watch)
            self._watch = None
        while self._undo:
            self._undo.pop()()

    def _patch(self, name: str, module: ModuleType) -> None:
        if name == "plyfile":
            cls = getattr(module, "PlyData", None)
            if cls is not None and callable(getattr(cls, "read", None)):
                wrapped = self._wrap(cls.read, _ply_holds_params, "ply", "plyfile.PlyData.read")
                self._swap(cls, "read", staticmethod(wrapped))
            return
        load = getattr(module, "load", None)
        if not callable(load):
            return
        wrapped = self._wrap(load, _pt_holds_params, "pt", "torch.load")
        self._swap(module, "load", wrapped)
        serialization = getattr(module, "serialization", None)
        if serialization is not None and getattr(serialization, "load", None) is load:
            self._swap(serialization, "load", wrapped)

    def _swap(self, owner: Any, attr: str, new: Any) -> None:
        """Set ``owner.attr = new``; undone at case end unless someone replaced it since."""
        old = vars(owner).get(attr)
        if old is None:
            return
        setattr(owner, attr, new)

        def undo() -> None:
            if vars(owner).get(attr) is new:
                setattr(owner, attr, old)

        self._undo.append(undo)

    def _wrap(
        self, read: Callable[..., Any], holds: Callable[[Any], bool], fmt: str, via: str
    ) -> Callable[..., Any]:
        @functools.wraps(read)
        def reader(*args: Any, **kwargs: Any) -> Any:
            out = read(*args, **kwargs)
            try:
                if holds(out):
                    source = args[0] if args else kwargs.get("f", kwargs.get("stream"))
                    self._saw(source, fmt, via, sys._getframe(1))
            except Exception as err:  # a detector must never take a case down with it
                with self._lock:
                    self._errors.append(f"{via}: {err!r}")
            return out

        return reader

    def _saw(self, source: Any, fmt: str, via: str, frame: FrameType) -> None:
        """The case read ``source`` and got 3DGS parameters: lint the file (once)."""
        path = _path_of(source)
        if path is None:
            return
        judged, where = _caller(frame)
        if judged:
            return
        try:
            st = os.stat(path)
        except OSError:
            return
        path = os.path.abspath(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._reads:
                return
            report = self._cache.get(key)
        if report is None:
            from gpucheck.checkpoints.lint import lint

            report = lint(path, fmt=fmt)
        with self._lock:
            self._cache[key] = report
            self._reads.setdefault(key, _Read(path, via, where, report))


def _finding(r: _Read, case: CaseInfo) -> Finding | None:
    """The finding of one checkpoint read: activated -> error, suspicious -> warning."""
    from gpucheck.checkpoints.lint_text import render_text

    report = r.report
    if report.verdict not in ("activated", "suspicious"):
        return None
    read = f"read with {r.via}" + (f" at {r.where}" if r.where else "")
    evidence = f"{read}\n{render_text(dataclasses.replace(report, fix=None))}"
    if report.verdict == "activated":
        fields = [
            p.name
            for p in report.params
            if p.verdict == "activated" and p.name in ("scales", "opacities")
        ]
        message = (
            f"{r.path}: the case read a checkpoint whose {' and '.join(fields)} are "
            f"stored activated; a 3DGS loader activates them again"
        )
        return case.finding(
            "double-activation", "error", message, evidence=evidence, hint=report.fix
        )
    odd = [p.name for p in report.params if p.verdict == "suspicious"]
    return case.finding(
        "checkpoint-suspicious",
        "warning",
        f"{r.path}: the case read a checkpoint whose {', '.join(odd)} look "
        f"suspicious to `gpucheck lint-checkpoint`",
        evidence=evidence,
        hint=report.fix,
    )
