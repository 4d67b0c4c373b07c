"""The defects planted in csrc/knn/ (csrc/README.md has the table): each defect build by name
-> the macro that plants it (:mod:`gpucheck._csrc.defects` builds them)."""

DEFECTS = {
    "no_guard_knn": "GPUCHECK_DEFECT_NO_GUARD",
    "set_device": "GPUCHECK_DEFECT_SET_DEVICE",
    "output_current_device": "GPUCHECK_DEFECT_OUTPUT_CURRENT_DEVICE",
    "uninit_read": "GPUCHECK_DEFECT_UNINIT_READ",
    "nondeterminism": "GPUCHECK_DEFECT_NONDETERMINISM",
}
