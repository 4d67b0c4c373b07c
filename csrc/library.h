// The operator library (namespace) gpucheck's kernels register in: `gpucheck` (ops are
// `torch.ops.gpucheck.<op>`). A defect build (-DGPUCHECK_DEFECT_*, see csrc/README.md) also
// defines -DGPUCHECK_LIBRARY=<another name>, so that it loads next to the real extension in
// one process: two TORCH_LIBRARY blocks for one namespace abort the second load.
#pragma once

#include <torch/library.h>

#ifndef GPUCHECK_LIBRARY
#define GPUCHECK_LIBRARY gpucheck
#endif

// TORCH_LIBRARY* paste their namespace argument (##), which stops macro expansion there;
// these wrappers expand GPUCHECK_LIBRARY first.
#define GPUCHECK_TORCH_LIBRARY_(ns, m) TORCH_LIBRARY(ns, m)
#define GPUCHECK_TORCH_LIBRARY(m) GPUCHECK_TORCH_LIBRARY_(GPUCHECK_LIBRARY, m)
#define GPUCHECK_TORCH_LIBRARY_IMPL_(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)
#define GPUCHECK_TORCH_LIBRARY_IMPL(key, m) GPUCHECK_TORCH_LIBRARY_IMPL_(GPUCHECK_LIBRARY, key, m)
