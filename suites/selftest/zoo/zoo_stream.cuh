// gpucheck's self-test zoo: the stream discipline of the defect builds' kernels.
//   GPUCHECK_ZOO_LEGACY_STREAM  a family's kernels launched with <<<grid, block>>> (the
//                               legacy default stream) instead of <<<grid, block, 0, stream>>>
// A defect launch on stream 0 is unordered with the caller's (non-default) stream: it waits
// for `stream` before and for stream 0 after (zoo_legacy_enter / zoo_legacy_exit), so the
// results stay right, as they are under CUDA_LAUNCH_BLOCKING=1: only the stream is wrong.
#pragma once

#include <cuda_runtime.h>

inline cudaError_t zoo_legacy_enter(cudaStream_t stream) { return cudaStreamSynchronize(stream); }
inline cudaError_t zoo_legacy_exit() { return cudaStreamSynchronize(nullptr); }
