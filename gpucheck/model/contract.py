"""What the controller and its worker processes agree on besides the records and the worker's
state file (:mod:`gpucheck.model.worker_state`): a worker's exit codes, the environment a
pass sets, the test properties the worker's fixtures leave for the recorder. One place, so
neither side imports the other for a name."""

from __future__ import annotations

# --- environment of a worker ------------------------------------------------------------
#: target devices of plain pytest (``GPUCHECK_DEVICES=0,1``)
DEVICES_ENV = "GPUCHECK_DEVICES"
#: "other" (default): another device is current and initialized while the target is tested;
#: "target": the target itself is current and no other device is touched
CURRENT_ENV = "GPUCHECK_CURRENT"
OTHER_CURRENT, TARGET_CURRENT = "other", "target"
#: "poisoned" (default): a non-default stream is current on the target device during a test;
#: "default": the default stream stays current
STREAM_ENV = "GPUCHECK_STREAM"
#: the device label a worker's records carry where it is not ``cuda:N`` (``rank1/cuda:1``)
DEVICE_LABEL_ENV = "GPUCHECK_DEVICE_LABEL"
#: the ``nvml_tracker`` fixture's sampling period (seconds)
NVML_INTERVAL_ENV = "GPUCHECK_NVML_INTERVAL"

#: ``FD:INODE:PID`` of the controller's lifeline: a pipe whose other end only the controller
#: (process PID) holds; when it reads end-of-file the controller is gone and the worker stops at
#: once (the inode proves the descriptor is still that pipe). A worker whose parent is PID also
#: asks the kernel for SIGKILL when its parent dies: that needs no GIL, which a hang in C code
#: may hold forever
LIFELINE_FD_ENV = "GPUCHECK_LIFELINE_FD"
#: the cgroup (a folder of the cgroup2 file system) the controller made for a worker, where it
#: could make one: the worker joins it before its first case, so that whatever its cases
#: start, in a session of their own too, is in it and ends with it (gpucheck.processes)
CGROUP_ENV = "GPUCHECK_CGROUP"

# --- a worker's exit ----------------------------------------------------------------------
#: exit code of a worker that stopped because its CUDA context is lost (the controller
#: replaces it with a fresh one)
EXIT_CONTEXT_LOST = 75
#: exit code of a sanitizer pass's worker that printed close to compute-sanitizer's
#: ``--print-limit`` (its state file says which case reached it, if one did): the controller
#: replaces it with a fresh one, so that no later case runs with too few records left
EXIT_SANITIZER_LIMIT = 73
#: exit code of a worker that could not write a record (disk full, folder read-only): the
#: controller stops the run
EXIT_OUTPUT_ERROR = 74
#: pytest exit codes that mean a worker ended normally (0 ok, 1 failures, 5 no tests)
NORMAL_EXITS = (0, 1, 5)

# --- test properties (``item.user_properties``) -------------------------------------------
CURRENT_DEVICE_PROPERTY = "gpucheck_current_device"
CURRENT_STREAM_PROPERTY = "gpucheck_current_stream"
NVML_PEAK_PROPERTY = "gpucheck_nvml_peak"
#: a finding outside ``gpucheck run`` (JSON), summed up at the end of the session
FINDING_PROPERTY = "gpucheck_finding"
#: the case that lost the process's CUDA context, on the tests not run after it
CONTEXT_LOST_PROPERTY = "gpucheck_context_lost_in"
#: the name the recorder is registered under in a worker's plugin manager
RECORDER = "gpucheck-recorder"
