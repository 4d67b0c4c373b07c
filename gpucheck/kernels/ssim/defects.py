"""The defects planted in csrc/ssim/ (csrc/README.md has the table): each defect build by name
-> the macro that plants it (:mod:`gpucheck._csrc.defects` builds them)."""

DEFECTS = {
    "legacy_stream": "GPUCHECK_DEFECT_LEGACY_STREAM",
    "no_guard_ssim": "GPUCHECK_DEFECT_NO_GUARD",
    "shared_oob": "GPUCHECK_DEFECT_SHARED_OOB",
    "no_sync": "GPUCHECK_DEFECT_NO_SYNC",
}
