// The operator library (namespace) gpucheck's kernels register in: `gpucheck` (ops are
// `torch.ops.gpucheck.<op>`). registration.cpp claims it (GPUCHECK_TORCH_LIBRARY); each kernel
// declares its own ops' schemas next to their implementations, in a
// GPUCHECK_TORCH_LIBRARY_FRAGMENT of its entry-point file (csrc/<kernel>/<kernel>.cpp).
// A defect build (-DGPUCHECK_DEFECT_*, see csrc/README.md) also defines
// -DGPUCHECK_LIBRARY=<another name>, so that it loads next to the real extension in one
// process: two TORCH_LIBRARY blocks for one namespace abort the second load, and two
// definitions of one op (a fragment's) abort it too.
#pragma once

#include <torch/library.h>

#ifndef GPUCHECK_LIBRARY
#define GPUCHECK_LIBRARY gpucheck
#endif

// TORCH_LIBRARY* paste their namespace argument (##), which stops macro expansion there;
// these wrappers expand GPUCHECK_LIBRARY first.
#define GPUCHECK_TORCH_LIBRARY_(ns, m) TORCH_LIBRARY(ns, m)
#define GPUCHECK_TORCH_LIBRARY(m) GPUCHECK_TORCH_LIBRARY_(GPUCHECK_LIBRARY, m)
#define GPUCHECK_TORCH_LIBRARY_FRAGMENT_(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define GPUCHECK_TORCH_LIBRARY_FRAGMENT(m) GPUCHECK_TORCH_LIBRARY_FRAGMENT_(GPUCHECK_LIBRARY, m)
#define GPUCHECK_TORCH_LIBRARY_IMPL_(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)
#define GPUCHECK_TORCH_LIBRARY_IMPL(key, m) GPUCHECK_TORCH_LIBRARY_IMPL_(GPUCHECK_LIBRARY, key, m)
