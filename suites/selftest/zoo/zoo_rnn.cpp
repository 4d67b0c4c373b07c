// gpucheck's self-test zoo: the entry points and bindings of a custom RNN in the shape of
// RWKV-4's wkv_op.cpp: forward(B, T, C, w, u, k, v, h0, y) writes y, allocated by the caller;
// h0 is the initial state [B, C], or a zero-element placeholder (torch.empty(0)) for zeros.
// Like many such kernels it copies a state given on another device to the inputs' device
// instead of refusing it (a hidden copy per call; mixed-device calls are the caller's slip).
// The defects are the guard ones of zoo_common.h and the stream one of zoo_rnn.cu.
#include "zoo_common.h"

#include <initializer_list>

namespace TORCH_EXTENSION_NAME {

cudaError_t wkv_forward_launch(int B, int T, int C, const float* w, const float* u,
                               const float* k, const float* v, const float* h0, float* y,
                               cudaStream_t stream);
cudaError_t wkv_backward_launch(int B, int T, int C, const float* w, const float* u,
                                const float* k, const float* v, const float* h0, const float* y,
                                const float* gy, float* gw, float* gu, float* gk, float* gv,
                                float* gh0, cudaStream_t stream);

namespace {

void check_shapes(int64_t B, int64_t T, int64_t C, const at::Tensor& w, const at::Tensor& u,
                  const at::Tensor& k, const at::Tensor& v) {
  for (const at::Tensor* t : {&w, &u, &k, &v}) ZOO_CHECK_CUDA_FLOAT(*t);
  TORCH_CHECK(w.numel() == C && u.numel() == C, "w and u must be [C = ", C, "], got ",
              w.sizes(), " and ", u.sizes());
  TORCH_CHECK(k.numel() == B * T * C && v.numel() == B * T * C, "k and v must be [B, T, C] = [",
              B, ", ", T, ", ", C, "], got ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK(B * C % (C < 32 ? C : 32) == 0, "B * C must be a multiple of min(C, 32)");
}

// The initial state on the inputs' device (a copy when given elsewhere), or undefined.
at::Tensor state_on(const at::Tensor& h0, const at::Tensor& like, int64_t B, int64_t C) {
  if (!zoo_given(h0)) return at::Tensor();
  TORCH_CHECK(h0.numel() == B * C, "h0 must be [B, C] = [", B, ", ", C, "], got ", h0.sizes());
  return h0.to(like.device(), at::kFloat).contiguous();
}

}  // namespace

void forward(int64_t B, int64_t T, int64_t C, const at::Tensor& w,  // [C]
             const at::Tensor& u,                                   // [C]
             const at::Tensor& k,                                   // [B, T, C]
             const at::Tensor& v,                                   // [B, T, C]
             const at::Tensor& h0,                                  // [B, C] or [0]
             at::Tensor& y) {                                       // [B, T, C] out
  ZOO_GUARD(w);
  check_shapes(B, T, C, w, u, k, v);
  ZOO_CHECK_CUDA_FLOAT(y);
  const at::Tensor state = state_on(h0, w, B, C);
  C10_CUDA_CHECK(wkv_forward_launch(
      static_cast<int>(B), static_cast<int>(T), static_cast<int>(C), w.data_ptr<float>(),
      u.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
      state.defined() ? state.data_ptr<float>() : nullptr, y.data_ptr<float>(),
      c10::cuda::getCurrentCUDAStream()));
}

void backward(int64_t B, int64_t T, int64_t C, const at::Tensor& w,  // [C]
              const at::Tensor& u,                                   // [C]
              const at::Tensor& k,                                   // [B, T, C]
              const at::Tensor& v,                                   // [B, T, C]
              const at::Tensor& h0,                                  // [B, C] or [0]
              const at::Tensor& y,                                   // [B, T, C]
              const at::Tensor& gy,                                  // [B, T, C]
              at::Tensor& gw, at::Tensor& gu,                        // [B, C] out
              at::Tensor& gk, at::Tensor& gv,                        // [B, T, C] out
              at::Tensor& gh0) {                                     // [B, C] out
  ZOO_GUARD(w);
  check_shapes(B, T, C, w, u, k, v);
  const std::initializer_list<const at::Tensor*> outs = {&y, &gy, &gw, &gu, &gk, &gv, &gh0};
  for (const at::Tensor* t : outs) {
    ZOO_CHECK_CUDA_FLOAT(*t);
  }
  const at::Tensor state = state_on(h0, w, B, C);
  C10_CUDA_CHECK(wkv_backward_launch(
      static_cast<int>(B), static_cast<int>(T), static_cast<int>(C), w.data_ptr<float>(),
      u.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
      state.defined() ? state.data_ptr<float>() : nullptr, y.data_ptr<float>(),
      gy.data_ptr<float>(), gw.data_ptr<float>(), gu.data_ptr<float>(), gk.data_ptr<float>(),
      gv.data_ptr<float>(), gh0.data_ptr<float>(), c10::cuda::getCurrentCUDAStream()));
}

}  // namespace TORCH_EXTENSION_NAME

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &TORCH_EXTENSION_NAME::forward, "wkv forward");
  m.def("backward", &TORCH_EXTENSION_NAME::backward, "wkv backward");
}
