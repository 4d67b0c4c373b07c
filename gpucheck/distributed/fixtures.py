"""The ``dist_rank`` fixture (registered by gpucheck's pytest plugin).

A test that takes ``dist_rank`` runs on every rank of the group at once: the fixture joins the
process group once per worker (env://, see :mod:`gpucheck.distributed.rank`), meets the other ranks
at the start of the case, logs the case's collectives, and at the end writes the case's
outcome to the collective log and meets the others again. Outside a distributed run (no
``RANK``/``WORLD_SIZE``) such tests are skipped with the reason.

``@pytest.mark.dist_timeout(SECONDS)`` gives a distributed case its own time limit: the
watchdog declares a hang once the case runs longer than that (or than ``--timeout``, whichever
is shorter). A rank stuck in its own code while the others wait in a collective looks like a
slow rank until then, so a case that must finish quickly should say so.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gpucheck.distributed.analysis import GROUP_LOST_EXIT

_CALL_REPORT = pytest.StashKey[pytest.TestReport]()
MARKER = "dist_timeout"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(seconds): the distributed watchdog's time limit for this case, "
        "when shorter than --timeout (gpucheck run --distributed)",
    )


def case_timeout(item: pytest.Item) -> float | None:
    """The ``dist_timeout`` of a case, in seconds, or None."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    seconds = marker.args[0] if marker.args else marker.kwargs.get("seconds")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
        raise pytest.UsageError(
            f"{item.nodeid}: {MARKER} takes a positive number of seconds, got {seconds!r}"
        )
    return float(seconds)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[Any]:
    outcome: Any = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_CALL_REPORT] = report


@pytest.fixture(scope="session")
def _dist_group() -> Iterator[Any]:
    from gpucheck.distributed import rank as rank_mod

    if rank_mod.env_ranks() is None:
        pytest.skip(
            "not a rank of a distributed run: run it with `gpucheck run --distributed` "
            "or under torchrun"
        )
    yield rank_mod.init()
    rank_mod.shutdown()


def _case_id(request: pytest.FixtureRequest) -> str:
    recorder = request.config.pluginmanager.get_plugin("gpucheck-recorder")
    nodeid = request.node.nodeid
    return str(recorder.ids.get(nodeid, nodeid)) if recorder is not None else nodeid


@pytest.fixture
def dist_rank(_dist_group: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """This process's :class:`gpucheck.distributed.rank.Rank` for one distributed case."""
    rank = _dist_group
    case = _case_id(request)
    _meet(rank, case, "start")
    if rank.log is not None:
        rank.log.case_started(case, case_timeout(request.node))
    yield rank
    report = request.node.stash.get(_CALL_REPORT, None)
    outcome = "error" if report is None else report.outcome
    error = None
    if report is not None and report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        error = (crash.message.strip().splitlines() or [""])[0][:500] if crash else None
    if rank.log is not None:
        rank.log.case_finished(case, outcome, error)
    _meet(rank, case, "end")


def _meet(rank: Any, case: str, phase: str) -> None:
    """The case boundary; when the rendezvous store is gone (a peer, maybe the store's host,
    died) this rank stops at once: racing on through the next cases would fail each of them
    for a reason that is not theirs."""
    from gpucheck.distributed.rank import DistSetupError

    try:
        rank.boundary(case, phase)
    except DistSetupError:
        raise
    except Exception as err:
        if rank.log is not None:
            rank.log.group_lost(case, phase, str(err)[:300])
        sys.stderr.write(
            f"gpucheck: rank {rank.rank}: the other ranks are gone at the "
            f"{phase} of {case} ({err}); this rank stops\n"
        )
        sys.stderr.flush()
        os._exit(GROUP_LOST_EXIT)
