"""``gpucheck run --shard I/N [--durations RUN]``: the controller's side of a shard. It reads
the durations of the earlier run once, writes the run's shard plan into the run folder
(:class:`~gpucheck.model.shard.ShardPlan`), and hands it to every worker, which keeps its
shard's cases of what it collects (:mod:`gpucheck.worker.recorder`)."""

from __future__ import annotations

from pathlib import Path

from gpucheck.controller.config import RunConfig
from gpucheck.errors import UsageProblem
from gpucheck.model.layout import RESULTS, RunFolder
from gpucheck.model.runlog import RunLog
from gpucheck.model.shard import ShardPlan, weights_of


def durations_results(given: Path) -> Path:
    """The results file of an earlier run, given as its run folder or the file itself.

    Raises:
        UsageProblem: neither, or a file with no case record to take durations from.
    """
    path = given / RESULTS if given.is_dir() else given
    if not path.is_file():
        raise UsageProblem(
            f"--durations {str(given)!r}: expected the run folder of an earlier run or its "
            f"{RESULTS}, and there is no {str(path)!r}"
        )
    if not RunLog.read(path).cases:
        raise UsageProblem(
            f"--durations {str(given)!r}: {str(path)!r} holds no case record to take durations from"
        )
    return path


def refuse_inapplicable(cfg: RunConfig) -> None:
    """``--durations`` without ``--shard``, ``--shard`` with ``--distributed``, or durations
    that cannot be read: one sentence, before any folder is made."""
    if cfg.durations is not None and cfg.shard is None:
        raise UsageProblem("--durations balances the shards of --shard: add --shard I/N")
    if cfg.shard is not None and cfg.distributed:
        raise UsageProblem(
            "--shard splits the cases of a run over several jobs, and --distributed runs "
            "one group of ranks: drop one of them"
        )
    if cfg.durations is not None:
        durations_results(cfg.durations)


def first_shard(cfg: RunConfig) -> bool:
    """Whether the run runs what is run once for the whole plan (the distributed suite's CPU
    group of the default ``--cpu-only`` run): an unsharded run, or shard 1."""
    return cfg.shard is None or cfg.shard[0] == 1


def plan(shard: tuple[int, int], durations: Path | None) -> ShardPlan:
    """The plan of shard ``shard`` (index, count), balanced by ``durations`` when given."""
    if durations is None:
        return ShardPlan(*shard)
    path = durations_results(durations)
    return ShardPlan(*shard, weights_of(RunLog.read(path).cases), str(path.resolve()))


def prepare(shard: tuple[int, int] | None, durations: Path | None, out: Path) -> None:
    """Write the plan of a new sharded run into its folder (a resumed run has it already)."""
    if shard is not None and not RunFolder(out).shard.exists():
        plan(shard, durations).write(RunFolder(out).shard)


def worker_args(out: Path) -> list[str]:
    """The pytest options that make a worker run only the shard of the run in ``out``."""
    path = RunFolder(out).shard
    return ["--gpucheck-shard", str(path)] if path.exists() else []
