"""The controller: the parent process of a run. It plans the passes, spawns and watches the
worker processes, re-runs the wrong-device suspects, runs the run-level detectors and writes
the reports.

* :mod:`~gpucheck.controller.entry`: ``run(cfg)``, the one way in;
* :mod:`~gpucheck.controller.config`: the run's settings, folder, targets, passes, header;
* :mod:`~gpucheck.controller.pipeline`: the single-process controller;
* :mod:`~gpucheck.controller.dist_pipeline`: the distributed one (one torch.distributed
  group), built on the pipeline's public functions;
* :mod:`~gpucheck.controller.harness` / :mod:`~gpucheck.controller.dist_harness`: worker and
  rank processes, their crashes and hangs;
* :mod:`~gpucheck.controller.progress`: the console; :mod:`~gpucheck.controller.suites`:
  where suites are found.
"""
