"""``gpucheck run``'s one entry into the controller: the settings checked, a resumed run's
settings loaded, and the run handed to the single-process controller
(:mod:`~gpucheck.controller.pipeline`) or the distributed one
(:mod:`~gpucheck.controller.dist_pipeline`), which builds on it. Each is imported when it
runs: the single-process run starts its first worker before the others could be imported."""

from __future__ import annotations

from pathlib import Path

from gpucheck.controller import pipeline, sharding
from gpucheck.controller.config import RunConfig, load_resume, refuse_inapplicable
from gpucheck.model.runlog import RunHeader


def run(cfg: RunConfig) -> int:
    """Run the suites on every target device; returns the exit code of the whole run."""
    refuse_inapplicable(cfg)
    sharding.refuse_inapplicable(cfg)
    previous: RunHeader | None = None
    if cfg.resume is not None:
        cfg, previous = load_resume(cfg.resume, cfg)
    if cfg.ray is not None:
        from gpucheck.controller import fleet

        return fleet.run(cfg, previous)
    if cfg.distributed:
        from gpucheck.controller import dist_pipeline

        return dist_pipeline.run(cfg, previous)
    cpu_pass = _cpu_dist_pass if sharding.first_shard(cfg) else None
    return pipeline.run(cfg, previous, cpu_dist_pass=cpu_pass)


def _cpu_dist_pass(cfg: RunConfig, out: Path, results: Path, run_id: str, notes: list[str]) -> bool:
    """The distributed suite as a CPU group (:func:`gpucheck.controller.dist_pipeline.cpu_pass`),
    in the default run without a GPU."""
    from gpucheck.controller import dist_pipeline

    return dist_pipeline.cpu_pass(cfg, out, results, run_id, notes)
