// WKV-style linear recurrence over [B, T, C], per (batch, channel):
//   y[t] = s[t-1] + u * k[t] * v[t]        (s[-1] = 0)
//   s[t] = w * s[t-1] + k[t] * v[t]        (w in (0, 1]: the channel's decay)
// Launchers (wkv_cuda.cu, which sees c10's BFloat16 only) and entry points (wkv.cpp).
//
// Deliberate defects (gpucheck's example; each behind its own macro, never a copied file):
//   CUSTOM_RNN_DEFECT_NO_GUARD             entry points launch without a device guard
//   CUSTOM_RNN_DEFECT_BF16_ACCUM           bfloat16 accumulates its state in bfloat16
//   CUSTOM_RNN_DEFECT_GRAD_CURRENT_DEVICE  the backward allocates dw, du on the current device
#pragma once

#include <c10/util/BFloat16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace custom_rnn {

// The type the recurrence accumulates in: float for float and bfloat16, double for double.
template <typename scalar_t> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
#ifdef CUSTOM_RNN_DEFECT_BF16_ACCUM
template <> struct Acc<c10::BFloat16> { using type = c10::BFloat16; };  // the defect
#endif
template <typename scalar_t> using acc_t = typename Acc<scalar_t>::type;

template <typename scalar_t>
void launch_wkv_forward(const scalar_t* w,  // [C]
                        const scalar_t* u,  // [C]
                        const scalar_t* k,  // [B, T, C]
                        const scalar_t* v,  // [B, T, C]
                        scalar_t* y,        // [B, T, C]
                        int64_t B, int64_t T, int64_t C, cudaStream_t stream);

template <typename scalar_t>
void launch_wkv_backward(const scalar_t* w,     // [C]
                         const scalar_t* u,     // [C]
                         const scalar_t* k,     // [B, T, C]
                         const scalar_t* v,     // [B, T, C]
                         const scalar_t* gy,    // [B, T, C]
                         acc_t<scalar_t>* states,  // [B, T, C] scratch
                         scalar_t* gk,          // [B, T, C]
                         scalar_t* gv,          // [B, T, C]
                         acc_t<scalar_t>* gw,   // [B, C] per-batch partial sums
                         acc_t<scalar_t>* gu,   // [B, C] per-batch partial sums
                         int64_t B, int64_t T, int64_t C, cudaStream_t stream);

}  // namespace custom_rnn

#ifdef __cplusplus
#if !defined(__CUDACC__)
#include <ATen/core/Tensor.h>

namespace custom_rnn {
// Entry points (wkv.cpp), registered by bindings.cpp.
at::Tensor wkv_forward(const at::Tensor& w, const at::Tensor& u, const at::Tensor& k,
                       const at::Tensor& v);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> wkv_backward(
    const at::Tensor& w, const at::Tensor& u, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& gy);
const char* defect_name();  // the defect macro this build was compiled with ("": none)
}  // namespace custom_rnn
#endif
#endif
