// Shared helpers for gpucheck's reference kernels: device guard and input checks.
// Included by the entry-point .cpp files (not by .cu files, which stay free of torch headers
// where they can).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/DeviceGuard.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

// Every entry point starts with GPUCHECK_DEVICE_GUARD(first_tensor_argument);
// Building with -DGPUCHECK_DEFECT_NO_GUARD removes the guard (failures 1 and 2 of
// docs/failures.md) so that the harness can prove it finds the defect; never define it in a release build.
#ifdef GPUCHECK_DEFECT_NO_GUARD
#define GPUCHECK_DEVICE_GUARD(tensor) ((void)(tensor))
#elif defined(GPUCHECK_DEFECT_SET_DEVICE)
// Defect (selftest): the published "fix" of the wrong-device crash, a bare cudaSetDevice. Every
// launch lands on the right device and every test passes, but the caller's current device is
// never restored (device-state-leak).
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#define GPUCHECK_DEVICE_GUARD(tensor) C10_CUDA_CHECK(cudaSetDevice((tensor).get_device()))
#else
#define GPUCHECK_DEVICE_GUARD(tensor) \
  const at::cuda::OptionalCUDAGuard gpucheck_device_guard_(at::device_of(tensor))
#endif

namespace gpucheck {

// `name` must be a CUDA tensor.
inline void check_cuda(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got one on ", t.device());
}

// `name` must live on the same device as `ref` (named `ref_name`).
inline void check_same_device(const at::Tensor& ref, const char* ref_name, const at::Tensor& t,
                              const char* op, const char* name) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " is on ", t.device(), " but ",
              ref_name, " is on ", ref.device(), "; all inputs must be on the same device");
}

}  // namespace gpucheck
