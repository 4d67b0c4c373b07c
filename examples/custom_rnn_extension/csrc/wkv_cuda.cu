// Kernels of the WKV recurrence: one thread per (batch, channel), walking T.
#include "wkv.h"

#include <c10/cuda/CUDAException.h>

namespace custom_rnn {
namespace {

constexpr int kThreads = 128;

template <typename scalar_t>
__global__ void wkv_forward_kernel(const scalar_t* __restrict__ w, const scalar_t* __restrict__ u,
                                   const scalar_t* __restrict__ k,
                                   const scalar_t* __restrict__ v, scalar_t* __restrict__ y,
                                   int64_t B, int64_t T, int64_t C) {
  using acc = acc_t<scalar_t>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= B * C) return;
  const int64_t b = i / C, c = i % C;
  const acc wc = static_cast<acc>(w[c]), uc = static_cast<acc>(u[c]);
  acc s = static_cast<acc>(0);
  for (int64_t t = 0, at = b * T * C + c; t < T; ++t, at += C) {
    const acc kv = static_cast<acc>(k[at]) * static_cast<acc>(v[at]);
    y[at] = static_cast<scalar_t>(s + uc * kv);
    s = wc * s + kv;
  }
}

template <typename scalar_t>
__global__ void wkv_backward_kernel(const scalar_t* __restrict__ w,
                                    const scalar_t* __restrict__ u,
                                    const scalar_t* __restrict__ k,
                                    const scalar_t* __restrict__ v,
                                    const scalar_t* __restrict__ gy,
                                    acc_t<scalar_t>* __restrict__ states,
                                    scalar_t* __restrict__ gk, scalar_t* __restrict__ gv,
                                    acc_t<scalar_t>* __restrict__ gw,
                                    acc_t<scalar_t>* __restrict__ gu, int64_t B, int64_t T,
                                    int64_t C) {
  using acc = acc_t<scalar_t>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= B * C) return;
  const int64_t b = i / C, c = i % C, base = b * T * C + c;
  const acc wc = static_cast<acc>(w[c]), uc = static_cast<acc>(u[c]);
  acc s = static_cast<acc>(0);
  for (int64_t t = 0, at = base; t < T; ++t, at += C) {  // states s[t]
    s = wc * s + static_cast<acc>(k[at]) * static_cast<acc>(v[at]);
    states[at] = s;
  }
  // ds = dL/ds[t], walking t down: ds[T-1] = 0, ds[t-1] = gy[t] + w * ds[t]
  acc ds = static_cast<acc>(0), dw = static_cast<acc>(0), du = static_cast<acc>(0);
  for (int64_t t = T - 1; t >= 0; --t) {
    const int64_t at = base + t * C;
    const acc g = static_cast<acc>(gy[at]), kt = static_cast<acc>(k[at]),
              vt = static_cast<acc>(v[at]);
    const acc dkv = g * uc + ds;  // dL/d(k[t] v[t])
    gk[at] = static_cast<scalar_t>(dkv * vt);
    gv[at] = static_cast<scalar_t>(dkv * kt);
    du = du + g * kt * vt;
    if (t > 0) dw = dw + ds * states[at - C];
    ds = g + wc * ds;
  }
  gw[i] = dw;
  gu[i] = du;
}

int blocks(int64_t B, int64_t C) { return static_cast<int>((B * C + kThreads - 1) / kThreads); }

}  // namespace

template <typename scalar_t>
void launch_wkv_forward(const scalar_t* w, const scalar_t* u, const scalar_t* k,
                        const scalar_t* v, scalar_t* y, int64_t B, int64_t T, int64_t C,
                        cudaStream_t stream) {
  wkv_forward_kernel<scalar_t><<<blocks(B, C), kThreads, 0, stream>>>(w, u, k, v, y, B, T, C);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t>
void launch_wkv_backward(const scalar_t* w, const scalar_t* u, const scalar_t* k,
                         const scalar_t* v, const scalar_t* gy, acc_t<scalar_t>* states,
                         scalar_t* gk, scalar_t* gv, acc_t<scalar_t>* gw, acc_t<scalar_t>* gu,
                         int64_t B, int64_t T, int64_t C, cudaStream_t stream) {
  wkv_backward_kernel<scalar_t><<<blocks(B, C), kThreads, 0, stream>>>(
      w, u, k, v, gy, states, gk, gv, gw, gu, B, T, C);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#define CUSTOM_RNN_INSTANTIATE(T_)                                                          \
  template void launch_wkv_forward<T_>(const T_*, const T_*, const T_*, const T_*, T_*,     \
                                       int64_t, int64_t, int64_t, cudaStream_t);            \
  template void launch_wkv_backward<T_>(const T_*, const T_*, const T_*, const T_*,         \
                                        const T_*, acc_t<T_>*, T_*, T_*, acc_t<T_>*,        \
                                        acc_t<T_>*, int64_t, int64_t, int64_t, cudaStream_t);
CUSTOM_RNN_INSTANTIATE(float)
CUSTOM_RNN_INSTANTIATE(double)
CUSTOM_RNN_INSTANTIATE(c10::BFloat16)

}  // namespace custom_rnn
