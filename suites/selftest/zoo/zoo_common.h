// gpucheck's self-test zoo: what every zoo extension's entry points share. The zoo's
// extensions (zoo_<family>.cpp / .cu) are written the way the field writes them (3DGS
// rasterizers, fused SSIM, simple-knn, RWKV-style kernels) and built clean and with defect
// macros (gpucheck._csrc.zoo.ZOO_BUILDS); never use them.
//   GPUCHECK_ZOO_NO_GUARD    no device guard: kernels run on the caller's current device
//   GPUCHECK_ZOO_SET_DEVICE  a bare cudaSetDevice (the published simple-knn "fix"): the
//                            caller's current device is never restored
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/extension.h>

#if defined(GPUCHECK_ZOO_NO_GUARD)
#define ZOO_GUARD(t) (void)(t)  // Defect: no guard at all
#elif defined(GPUCHECK_ZOO_SET_DEVICE)
#define ZOO_GUARD(t) C10_CUDA_CHECK(cudaSetDevice((t).get_device()))  // Defect: never restored
#else
#define ZOO_GUARD(t) const at::cuda::OptionalCUDAGuard zoo_guard_(at::device_of(t))
#endif

#define ZOO_CHECK_CUDA_FLOAT(t)                                                            \
  TORCH_CHECK((t).is_cuda() && (t).scalar_type() == at::kFloat && (t).is_contiguous(),    \
              #t " must be a contiguous float32 CUDA tensor, got ", (t).options())

// "Not given": a zero-element tensor on any device (torch.Tensor([]), torch.empty(0)).
inline bool zoo_given(const at::Tensor& t) { return t.numel() != 0; }
