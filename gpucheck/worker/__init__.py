"""The worker side: what runs inside a pytest process to test and record cases.

* :mod:`~gpucheck.worker.case`: findings a case attaches, a lost CUDA context, and the
  detectors outside ``gpucheck run`` (plain pytest);
* :mod:`~gpucheck.worker.detector_loop`: the one loop that runs worker-side detectors around a
  case body;
* :mod:`~gpucheck.worker.recorder`: under ``gpucheck run``, one record per case into
  ``results.jsonl`` and the state file the controller watches;
* :mod:`~gpucheck.worker.targets`: which devices a suite targets (``--gpucheck-device``, xdist);
* :mod:`~gpucheck.worker.fixtures`: ``gpu_device``, ``other_device``, ``gpucheck_findings``,
  ``nvml_tracker``;
* :mod:`~gpucheck.worker.poison`: another device current and a side stream, before a case.

The plugin (:mod:`gpucheck.pytest_plugin`) registers options and hooks and hands each hook to
these modules; the controller (:mod:`gpucheck.controller`) never imports them: it reads what
they write (:mod:`gpucheck.model`).
"""
