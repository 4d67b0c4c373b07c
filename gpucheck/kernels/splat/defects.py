"""The defects planted in csrc/splat/ (csrc/README.md has the table): each defect build by name
-> the macro that plants it (:mod:`gpucheck._csrc.defects` builds them)."""

DEFECTS = {
    "buffers_current_device": "GPUCHECK_DEFECT_BUFFERS_CURRENT_DEVICE",
}
