"""``gpucheck run``'s one entry into the controller: the settings checked, a resumed run's
settings loaded, and the run handed to the single-process controller
(:mod:`~gpucheck.controller.pipeline`) or the distributed one
(:mod:`~gpucheck.controller.dist_pipeline`), which builds on it."""

from __future__ import annotations

from gpucheck.controller import dist_pipeline, fleet, pipeline, sharding
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
        return fleet.run(cfg, previous)
    if cfg.distributed:
        return dist_pipeline.run(cfg, previous)
    cpu_pass = dist_pipeline.cpu_pass if sharding.first_shard(cfg) else None
    return pipeline.run(cfg, previous, cpu_dist_pass=cpu_pass)
