"""Finding kinds: what each kind of finding is to the diagnosis step, declared by its maker.

A :class:`Kind` says what a finding of that kind is: a *diagnosis* (it names a cause: a
missing device guard, a launch on the legacy stream) or a *symptom* (how a failure looked from
outside: a crash, a failing assert, a raw sanitizer record), its place among the root causes
(``precedence``: when several diagnoses fire on one case, the first takes its symptoms), and
what to do about it when a finding carries no hint of its own. The report groups and ranks
findings by these declarations; it knows no kind by name.

Each maker declares its kinds once, next to the code that makes them, and the registry
collects them (:func:`gpucheck.detectors.registry.kinds`, the hook
``gpucheck_finding_kinds``): a detector in its module (its class's ``kinds``), the sanitizer in
:mod:`gpucheck.sanitizer`, the distributed watchdog in :mod:`gpucheck.distributed.kinds`, the
checkpoint detectors and another package's through the entry point group. The kinds below are
those of the makers that sit above the registry: the worker's record of a case's own failure,
the harness's record of a worker's death, ``check_op``'s own checks; the report, which sits
below the harness, must know them without importing it.

A kind nobody declares (a record of an older gpucheck, a finding a suite attached itself) is
read as a diagnosis without a place: :meth:`Kinds.of`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from gpucheck.model.results import COLLECTION_ERROR, CaseRecord, Finding

Role = Literal["diagnosis", "symptom"]
DIAGNOSIS: Role = "diagnosis"
SYMPTOM: Role = "symptom"
#: the hint of a kind that declares none
NO_HINT = "no hint recorded for this kind of finding"


@dataclass(frozen=True)
class Kind:
    """One kind of finding, as its maker declares it.

    Attributes:
        name: the finding's ``kind`` (``wrong-device``).
        role: diagnosis or symptom (:meth:`role_of` where it depends on the finding).
        precedence: its place among the root causes, lower first (gpucheck's own use 10,
            20, ...); None: after every kind with a place, ranked by how often it occurs.
        hint: what to do about it, where a finding carries no hint of its own.
        title: the heading of its findings in the report ("": made from its name).
        about: what a finding of this kind means, in one line ("": none).
        explains_as_warning: a diagnosis that explains its case's symptoms even at severity
            warning (by default only an error does).
        refine: the role of one finding of this kind where the finding decides it, else None.
    """

    name: str
    role: Role = DIAGNOSIS
    precedence: int | None = None
    hint: str = ""
    title: str = ""
    about: str = ""
    explains_as_warning: bool = False
    refine: Callable[[Finding, CaseRecord], Role] | None = None

    def role_of(self, finding: Finding, record: CaseRecord) -> Role:
        """The role of ``finding`` (of this kind) on ``record``."""
        return self.refine(finding, record) if self.refine is not None else self.role

    @property
    def heading(self) -> str:
        """Its title, or one made from its name (``memory-growth`` -> ``Memory growth``)."""
        return self.title or self.name.replace("-", " ").replace("_", " ").capitalize()


class Kinds:
    """Every kind declared, by name: the table the report and the controller read."""

    def __init__(self, declared: Iterable[Kind]) -> None:
        """The first declaration of a name stands (gpucheck's own come first)."""
        self.by_name: dict[str, Kind] = {}
        for kind in declared:
            self.by_name.setdefault(kind.name, kind)
        placed = sorted(
            (k for k in self.by_name.values() if k.precedence is not None),
            key=lambda k: (k.precedence, k.name),
        )
        #: the kinds with a place, root causes first
        self.precedence: tuple[str, ...] = tuple(k.name for k in placed)
        self._rank = {name: i for i, name in enumerate(self.precedence)}

    def of(self, name: str) -> Kind:
        """The declaration of ``name``; an undeclared kind is a diagnosis without a place."""
        return self.by_name.get(name) or Kind(name)

    def rank(self, name: str) -> int:
        """Where ``name`` stands among the root causes (0 first; every kind without a place
        after all those with one, and equal to each other)."""
        return self._rank.get(name, len(self.precedence))

    def role(self, finding: Finding, record: CaseRecord) -> Role:
        """``"diagnosis"`` or ``"symptom"`` for one finding of one case record."""
        return self.of(finding.kind).role_of(finding, record)

    def explains(self, finding: Finding) -> bool:
        """Whether a diagnosis ``finding`` explains the symptoms of its case: an error, or a
        warning of a kind that explains at that severity."""
        return finding.severity == "error" or self.of(finding.kind).explains_as_warning


def _hang_role(finding: Finding, record: CaseRecord) -> Role:
    """A hang the distributed watchdog recorded names the rank at fault: a diagnosis."""
    return DIAGNOSIS if record.distributed else SYMPTOM


# --- the harness: a worker that died or hung in a case, or outside any ----------------------
CRASH = Kind(
    "crash",
    SYMPTOM,
    hint="run the case alone under compute-sanitizer memcheck; an abort with "
    "'terminate called' is a C++ exception escaping the extension",
    title="Crashes",
    about="the worker process died inside a case (abort, segfault, lost context)",
)
HANG = Kind(
    "hang",
    SYMPTOM,
    hint="read the stacks: a thread waiting in a collective or a synchronize names the "
    "call that never returned",
    title="Hangs",
    about="a case made no progress within --timeout and was killed",
    refine=_hang_role,
)
WORKER_ERROR = Kind(
    "worker-error",
    SYMPTOM,
    hint="read the worker's stderr log: an import or build error of the suite",
    title="Worker errors",
    about="a worker failed outside any case (collection, start-up)",
)
# --- the worker: a case's own failure, what it saw of the process and of NVML ----------------
TEST_FAILURE = Kind(
    "test-failure",
    SYMPTOM,
    hint="compare the op with its reference on this device; if it passes on "
    "another device, suspect device handling rather than the math",
    title="Test failures",
    about="an assertion or exception of the test itself",
)
CUDA_ERROR = Kind(
    "cuda-error",
    SYMPTOM,
    hint="under CUDA_LAUNCH_BLOCKING=1 the error is raised at the failing launch; "
    "an illegal address only while another device is current is a missing "
    "device guard (the wrong-device check re-runs the case to tell)",
    title="CUDA errors",
    about="a CUDA error raised while the case ran",
)
NVML_ERROR = Kind(
    "nvml-error",
    SYMPTOM,
    hint="check the driver (nvidia-smi -q); the case's own result stands",
    title="NVML errors",
    about="NVML failed while the case ran: its NVML memory checks were not made",
)
COLLECTION = Kind(COLLECTION_ERROR)
PROCESS_STATE = Kind("process-state")
STRAY_PROCESS = Kind("stray-process")
# --- check_op: what its own checks find besides the detectors' kinds -------------------------
MEMORY_LEAK = Kind("memory-leak")

#: the kinds of the makers above the registry (the harness, the worker, check_op)
RECORDED = (
    CRASH,
    HANG,
    WORKER_ERROR,
    TEST_FAILURE,
    CUDA_ERROR,
    NVML_ERROR,
    COLLECTION,
    PROCESS_STATE,
    STRAY_PROCESS,
    MEMORY_LEAK,
)
