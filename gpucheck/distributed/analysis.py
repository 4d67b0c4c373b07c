"""Parent side: from every rank's collective log and process state to one diagnosis.

Pure functions over what the workers left on disk (:mod:`gpucheck.distributed.collectives` logs,
state files, exit codes), so that the same logic runs in the watchdog while the ranks are
alive and in tests on recorded logs. :func:`diagnose` answers, at one moment, whether the
group is stuck or broken and why:

* ``collective-mismatch``: ranks entered collective ``#seq`` with different ops, shapes or
  dtypes (they would deadlock, or exchange garbage);
* ``collective-device``: a rank passed a tensor on another device than its own (the wrapper
  refused it), or ranks entered one collective with tensors on different kinds of device;
* ``rank-crash``: a rank's process died while the others were still running: the cause;
* ``rank-failure``: a rank's case raised and ended while other ranks wait in a collective it
  will never enter;
* ``hang``: ranks wait in collective ``#seq`` that others did not arrive at: they finished the
  case without it (a rank-dependent branch skipped it: found at once), or are still running
  elsewhere when the per-case timeout expires.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpucheck.model.group import CollectiveEntry

#: ops whose tensors must have the same shapes and dtypes on every rank
SHAPE_STRICT = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
)
#: exit codes of a worker that ended normally (pytest: 0 ok, 1 failures, 5 no tests)
NORMAL_EXITS = (0, 1, 5)
#: exit code of a rank that stopped because its peers were gone (never the cause)
GROUP_LOST_EXIT = 76


@dataclass
class RankView:
    """What the parent knows about one rank at one moment."""

    rank: int
    entries: list[CollectiveEntry] = field(default_factory=list)
    exit_code: int | None = None  # None while the process runs
    case: str | None = None  # the case its state file says it runs
    stderr: str = ""

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    def opened(self) -> dict[int, CollectiveEntry]:
        """Collectives entered and not (yet) left, by seq."""
        open_: dict[int, CollectiveEntry] = {}
        for e in self.entries:
            if e.ev == "enter":
                open_[e.seq] = e
            elif e.ev in ("done", "error"):
                open_.pop(e.seq, None)
        return open_

    def entered(self) -> dict[int, CollectiveEntry]:
        return {e.seq: e for e in self.entries if e.ev == "enter"}

    def last_seq(self) -> int:
        return max(self.entered(), default=0)

    def case_end(self, case: str | None) -> CollectiveEntry | None:
        """The case-end line of ``case`` (the rank finished it), if written."""
        return next(
            (
                e
                for e in reversed(self.entries)
                if e.ev == "case-end" and (case is None or e.case == case)
            ),
            None,
        )

    def case_timeout(self) -> float | None:
        """The time limit the current case declared (``dist_timeout``), if any."""
        for e in reversed(self.entries):
            if e.ev == "case":
                return e.timeout
        return None

    def current_case(self) -> str | None:
        for e in reversed(self.entries):
            if e.ev in ("case", "enter"):
                return e.case or None
        return self.case


@dataclass
class GroupFault:
    """What the watchdog found wrong with a group of ranks (its kind, the ranks at fault and
    those left waiting): the harness makes it one record of the case."""

    kind: str  # hang | collective-mismatch | collective-device | rank-crash | rank-failure
    message: str
    case: str | None
    cause_ranks: list[int]  # the ranks at fault (did not arrive, crashed, mismatched)
    waiting_ranks: list[int] = field(default_factory=list)
    seq: int | None = None
    op: str | None = None
    hint: str | None = None
    positions: str = ""  # one line per rank: where it is


def signature(e: CollectiveEntry) -> tuple[Any, ...]:
    """What must agree between the ranks' entries of one collective."""
    if e.op in SHAPE_STRICT:
        return (e.op, tuple(map(tuple, e.shapes)), tuple(e.dtypes))
    return (e.op,)


def describe(e: CollectiveEntry) -> str:
    shapes = " ".join(f"[{', '.join(map(str, s))}]" for s in e.shapes)
    dtypes = ",".join(sorted(set(e.dtypes)))
    bits = [f"{e.op} #{e.seq}"]
    if shapes:
        bits.append(f"{shapes} {dtypes}")
    if e.where:
        bits.append(f"at {e.where}")
    if e.tag:
        bits.append(f"issued by {e.tag}")
    return " ".join(bits)


def position(v: RankView) -> str:
    """One line: where rank ``v`` is."""
    opened = v.opened()
    last = v.entered().get(v.last_seq())
    failed = next(
        (
            e
            for e in reversed(v.entries)
            if e.ev == "error" and last is not None and e.seq == last.seq
        ),
        None,
    )
    last_text = (
        "none"
        if last is None
        else describe(last) + (f" (failed: {failed.error})" if failed else "")
    )
    if opened:
        where = f"waits in {describe(opened[min(opened)])}"
    elif v.entries and v.entries[-1].ev == "case-end":
        end = v.entries[-1]
        where = (
            f"finished the case ({end.outcome}) and waits for the others at the "
            f"case boundary; last collective: {last_text}"
        )
    else:
        where = f"runs outside any collective; last collective: {last_text}"
    if not v.alive:
        where = f"exited ({_exit(v.exit_code)}); {where}"
    return f"rank {v.rank}: {where}"


def positions(views: list[RankView]) -> str:
    return "\n".join(position(v) for v in views)


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def _still_coming(views: list[RankView], seq: int, case: str | None) -> bool:
    """Whether a rank that has not entered collective ``seq`` yet may still enter it: alive,
    inside ``case`` (or not started), not finished with it."""
    return any(
        v.alive and v.last_seq() < seq and not _at_boundary(v) and v.current_case() in (None, case)
        for v in views
    )


def mismatch(views: list[RankView], *, timed_out: bool = False) -> GroupFault | None:
    """Ranks that entered one collective (same seq) with different ops/shapes/devices, or a
    rank whose wrapper refused a tensor on another device.

    Which rank is the odd one is judged on every rank that will enter the collective: while
    one may still arrive (and ``timed_out`` is false) there is no answer yet, because with
    three ranks, ranks 0 and 2 differing says nothing until rank 1 sides with one of them."""
    for v in views:
        for e in v.entries:
            if e.ev == "error" and e.kind == "device":
                return GroupFault(
                    "collective-device",
                    str(e.error),
                    _case_of(v, e),
                    [v.rank],
                    [u.rank for u in views if u is not v],
                    e.seq,
                    e.op,
                    DEVICE_HINT,
                    positions(views),
                )
    by_seq: dict[int, dict[int, CollectiveEntry]] = {}
    for v in views:
        for seq, e in v.entered().items():
            by_seq.setdefault(seq, {})[v.rank] = e
    for seq in sorted(by_seq):
        got = by_seq[seq]
        case = next(iter(got.values())).case
        if not timed_out and _still_coming(views, seq, case):
            return None
        kinds = {r: tuple(sorted({d.split(":")[0] for d in e.devices})) for r, e in got.items()}
        if len(set(kinds.values())) > 1:
            groups = _group(kinds)
            odd = min(groups, key=len)
            return GroupFault(
                "collective-device",
                f"collective #{seq} was entered with tensors on different kinds of device: "
                + "; ".join(
                    f"{_ranks(rs)}: {describe(got[rs[0]])} on {', '.join(got[rs[0]].devices)}"
                    for rs in groups
                ),
                got[odd[0]].case,
                odd,
                [r for r in got if r not in odd],
                seq,
                got[odd[0]].op,
                DEVICE_HINT,
                positions(views),
            )
        sigs = {r: signature(e) for r, e in got.items()}
        if len(set(sigs.values())) > 1:
            groups = _group(sigs)
            odd = min(groups, key=len) if len(groups[0]) != len(groups[-1]) else groups[-1]
            ops = {e.op for e in got.values()}
            what = "different collectives" if len(ops) > 1 else "different shapes or dtypes"
            hint = (
                SKIP_HINT
                if len(ops) > 1
                else "every rank must pass tensors of the same shape and dtype to this "
                "collective (pad variable-sized data, or all_gather the sizes first)"
            )
            return GroupFault(
                "collective-mismatch",
                f"ranks entered collective #{seq} with {what}: "
                + "; ".join(f"{_ranks(rs)}: {describe(got[rs[0]])}" for rs in groups),
                got[odd[0]].case,
                odd,
                [r for r in got if r not in odd],
                seq,
                got[odd[0]].op,
                hint,
                positions(views),
            )
    return None


def _verb(ranks: Any, one: str = "waits", many: str = "wait") -> str:
    return one if len(ranks) == 1 else many


def _group(values: dict[int, Any]) -> list[list[int]]:
    groups: dict[Any, list[int]] = {}
    for r in sorted(values):
        groups.setdefault(values[r], []).append(r)
    return sorted(groups.values(), key=lambda rs: (-len(rs), rs))


def _case_of(v: RankView, e: CollectiveEntry) -> str | None:
    return e.case or v.current_case()


def _blocked(views: list[RankView]) -> tuple[int, CollectiveEntry, list[int]] | None:
    """The first collective some rank entered and another did not: (seq, its entry, the
    ranks that entered it). Entered, not necessarily still inside: an NCCL collective returns
    to Python once it is queued, and its rank runs on until something waits for the GPU."""
    last = [v.last_seq() for v in views]
    low = min(last, default=0)
    if low == max(last, default=0):
        return None
    # the next collective after the one the slowest rank reached that some rank's log holds
    # (a log with a gap, e.g. a line lost to a full disk, must not stop the watchdog)
    seq = min(s for v in views for s in v.entered() if s > low)
    waiting = sorted(v.rank for v in views if v.last_seq() >= seq)
    entry = next(v.entered()[seq] for v in views if seq in v.entered())
    return seq, entry, waiting


def diagnose(views: list[RankView], *, timed_out: bool = False) -> GroupFault | None:
    """Why the group cannot go on, or None while it may still be fine.

    ``timed_out``: the current case ran past the per-case timeout (the watchdog asks).
    """
    found = mismatch(views, timed_out=timed_out)
    if found is not None:
        return found
    dead = [v for v in views if not v.alive and v.exit_code not in (*NORMAL_EXITS, GROUP_LOST_EXIT)]
    if dead and len(dead) < len(views):
        return _crash(views, dead[0])
    blocked = _blocked(views)
    if blocked is None:
        return _stuck_outside(views) if timed_out else None
    return _not_arrived(views, *blocked, timed_out=timed_out)


def _crash(views: list[RankView], v: RankView) -> GroupFault:
    """Rank ``v``'s process died while the others ran: the cause."""
    cause = f"rank {v.rank}'s process died ({_exit(v.exit_code)}) after collective #{v.last_seq()}"
    later = {
        u.rank: u.entered()[u.last_seq()]
        for u in views
        if u is not v and u.last_seq() > v.last_seq()
    }
    entry = later[min(later)] if later else None
    if entry is not None:
        msg = (
            f"{cause}; {_ranks(sorted(later))} {_verb(later, 'went', 'went')} on to "
            f"{describe(entry)}, which rank {v.rank} never entered: the crash on rank "
            f"{v.rank} is the cause, the others are stuck (or fail) because of it"
        )
    else:
        msg = f"{cause}; the other ranks can no longer finish their collectives"
    return GroupFault(
        "rank-crash",
        msg,
        v.current_case(),
        [v.rank],
        sorted(later),
        entry.seq if entry is not None else None,
        entry.op if entry is not None else None,
        CRASH_HINT,
        positions(views),
    )


def _stuck_outside(views: list[RankView]) -> GroupFault:
    """The case timed out with no collective pending."""
    stuck = [v.rank for v in views if v.alive and not _at_boundary(v)]
    return GroupFault(
        "hang",
        f"no collective is pending, but {_ranks(stuck or [v.rank for v in views])}"
        f" did not finish the case within the timeout",
        _first_case(views),
        stuck,
        [],
        None,
        None,
        "the stacks show where each rank is",
        positions(views),
    )


def _not_arrived(
    views: list[RankView],
    seq: int,
    entry: CollectiveEntry,
    waiting: list[int],
    *,
    timed_out: bool,
) -> GroupFault | None:
    """Ranks ``waiting`` entered collective ``seq``; the others did not: a rank that failed
    the case, ranks that left it without the collective, or (``timed_out``) ranks still
    elsewhere."""
    missing = [v for v in views if v.rank not in waiting and v.last_seq() < seq]
    if not missing:
        return None
    case = entry.case
    gone = [
        v
        for v in missing
        if not v.alive or _at_boundary(v) or (v.current_case() not in (None, case))
    ]
    failed = [v for v in gone if (end := v.case_end(case)) and end.outcome not in (None, "passed")]
    if failed:
        v = failed[0]
        end = v.case_end(case)
        why = end.error or end.outcome if end is not None else None
        return GroupFault(
            "rank-failure",
            f"rank {v.rank} failed the case before {describe(entry)} "
            f"({why}); {_ranks(waiting)} {_verb(waiting)} in it for ever",
            case,
            [v.rank],
            waiting,
            seq,
            entry.op,
            "an exception on one rank leaves the others in the next collective: fix the error "
            "of that rank (it is in its record), and make failures collective "
            "(e.g. all_reduce an error flag) in training code",
            positions(views),
        )
    names = [v.rank for v in missing]
    if gone:
        left = [v.rank for v in gone]
        others = [r for r in names if r not in left]
        message = (
            f"{_ranks(left)} did not arrive at {describe(entry)}: "
            f"{'it' if len(left) == 1 else 'they'} left the case after collective "
            f"#{max(v.last_seq() for v in gone)}; {_ranks(waiting)} {_verb(waiting)} in it for "
            "ever"
            + (f" ({_ranks(others)} not there yet)" if others else "")
            + (RENDER_MODE if _skip_hint(entry) == RENDER_HINT else "")
        )
    elif timed_out:
        left = names
        message = (
            f"{_ranks(names)} did not arrive at {describe(entry)} within the timeout; "
            f"{_ranks(waiting)} {_verb(waiting)} in it"
        )
    else:
        return None
    return GroupFault(
        "hang", message, case, left, waiting, seq, entry.op, _skip_hint(entry), positions(views)
    )


def _skip_hint(entry: CollectiveEntry) -> str:
    if entry.tag and "distributed=True" in entry.tag:
        return RENDER_HINT
    return SKIP_HINT


def _at_boundary(v: RankView) -> bool:
    return bool(v.entries) and v.entries[-1].ev == "case-end"


def _first_case(views: list[RankView]) -> str | None:
    return next((c for v in views if (c := v.current_case())), None)


def exit_text(v: RankView) -> str:
    return _exit(v.exit_code)


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


SKIP_HINT = (
    "every rank must issue the same collectives in the same order: a branch on the "
    "rank (or on rank-local data such as a batch size or an early exit) skipped one "
    "on the ranks named; move the collective out of the branch"
)
DEVICE_HINT = (
    "move the tensor to this rank's device before the collective (NCCL needs every "
    "tensor on the rank's own GPU; a CPU tensor there raises on that rank only and "
    "leaves the others waiting)"
)
CRASH_HINT = (
    "the crashed rank's stderr tail holds its last words; the other ranks only wait "
    "for it, their stacks are evidence, not causes"
)
RENDER_MODE = (
    ". The ranks called distributed rendering a different number of times, so each "
    "renders its own data: distributed=True is the wrong mode for this use "
    "(independent per-rank scenes need distributed=False)"
)
RENDER_HINT = (
    "distributed rendering (distributed=True) gathers the Gaussians of every rank on "
    "each call: every rank must call it as often as the others, with shards of ONE "
    "scene. With an independent scene per GPU the mode is wrong for this use: render "
    "with distributed=False (no collective at all)"
)
