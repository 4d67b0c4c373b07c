// Entry points of the WKV op: guard, checks, allocation, dtype dispatch (light headers:
// the defect builds recompile this file only; bindings.cpp registers it).
#include "wkv.h"

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <tuple>
#include <utility>

namespace custom_rnn {
namespace {

#ifdef CUSTOM_RNN_DEFECT_NO_GUARD
// The defect: no guard, so kernels launch on the caller's current device.
#define CUSTOM_RNN_GUARD(x)
#else
#define CUSTOM_RNN_GUARD(x) const at::cuda::OptionalCUDAGuard guard(device_of(x))
#endif

void check_inputs(const char* op, const at::Tensor& w, const at::Tensor& u, const at::Tensor& k,
                  const at::Tensor& v) {
  TORCH_CHECK(k.is_cuda(), op, ": k must be a CUDA tensor, got one on ", k.device());
  TORCH_CHECK(k.dim() == 3, op, ": k must be [B, T, C], got ", k.sizes());
  const auto st = k.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kDouble || st == at::kBFloat16, op,
                   ": k must be float32, float64 or bfloat16, got ", st);
  const int64_t C = k.size(2);
  const std::pair<const char*, const at::Tensor*> all[] = {{"w", &w}, {"u", &u}, {"k", &k},
                                                           {"v", &v}};
  for (const auto& [name, t] : all) {
    TORCH_CHECK(t->device() == k.device(), op, ": ", name, " must be on ", k.device(),
                " like k, got ", t->device());
    TORCH_CHECK_TYPE(t->scalar_type() == st, op, ": ", name, " must be ", st, " like k, got ",
                     t->scalar_type());
    TORCH_CHECK(t->is_contiguous(), op, ": ", name, " must be contiguous, got strides ",
                t->strides());
  }
  TORCH_CHECK(v.sizes() == k.sizes(), op, ": v must be ", k.sizes(), " like k, got ", v.sizes());
  TORCH_CHECK(w.dim() == 1 && w.size(0) == C, op, ": w must be [C] = [", C, "], got ", w.sizes());
  TORCH_CHECK(u.dim() == 1 && u.size(0) == C, op, ": u must be [C] = [", C, "], got ", u.sizes());
}

}  // namespace

at::Tensor wkv_forward(const at::Tensor& w,  // [C]
                       const at::Tensor& u,  // [C]
                       const at::Tensor& k,  // [B, T, C]
                       const at::Tensor& v   // [B, T, C]
) {
  CUSTOM_RNN_GUARD(k);
  check_inputs("custom_rnn::wkv", w, u, k, v);
  auto y = at::empty_like(k);
  if (k.numel() == 0) return y;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, k.scalar_type(), "wkv_forward", [&] {
    launch_wkv_forward<scalar_t>(w.data_ptr<scalar_t>(), u.data_ptr<scalar_t>(),
                                 k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                                 y.data_ptr<scalar_t>(), k.size(0), k.size(1), k.size(2),
                                 stream);
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> wkv_backward(
    const at::Tensor& w,   // [C]
    const at::Tensor& u,   // [C]
    const at::Tensor& k,   // [B, T, C]
    const at::Tensor& v,   // [B, T, C]
    const at::Tensor& gy   // [B, T, C]
) {
#ifdef CUSTOM_RNN_DEFECT_GRAD_CURRENT_DEVICE
  // The defect: dw and du allocated with torch::kCUDA before the guard, i.e. on whatever
  // device the caller has current (autograd makes the gradient's device current; a direct
  // call with another device current does not).
  auto gw = at::empty(w.sizes(), w.options().device(at::kCUDA));
  auto gu = at::empty(u.sizes(), u.options().device(at::kCUDA));
#endif
  CUSTOM_RNN_GUARD(k);
  check_inputs("custom_rnn::wkv_backward", w, u, k, v);
  TORCH_CHECK(gy.sizes() == k.sizes() && gy.device() == k.device() &&
                  gy.scalar_type() == k.scalar_type() && gy.is_contiguous(),
              "custom_rnn::wkv_backward: gy must be a contiguous ", k.scalar_type(), " ",
              k.sizes(), " tensor on ", k.device(), " like k, got ", gy.scalar_type(), " ",
              gy.sizes(), " on ", gy.device());
  auto gk = at::empty_like(k);
  auto gv = at::empty_like(v);
  const int64_t B = k.size(0), T = k.size(1), C = k.size(2);
  at::Tensor gw_part, gu_part;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, k.scalar_type(), "wkv_backward", [&] {
    using acc = acc_t<scalar_t>;
    const auto acc_options = k.options().dtype(c10::CppTypeToScalarType<acc>::value);
    gw_part = at::zeros({B, C}, acc_options);
    gu_part = at::zeros({B, C}, acc_options);
    if (k.numel() == 0) return;
    auto states = at::empty({B, T, C}, acc_options);
    launch_wkv_backward<scalar_t>(
        w.data_ptr<scalar_t>(), u.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
        v.data_ptr<scalar_t>(), gy.data_ptr<scalar_t>(), states.data_ptr<acc>(),
        gk.data_ptr<scalar_t>(), gv.data_ptr<scalar_t>(), gw_part.data_ptr<acc>(),
        gu_part.data_ptr<acc>(), B, T, C, c10::cuda::getCurrentCUDAStream());
  });
  // fixed-order reduction over the batch: deterministic
#ifdef CUSTOM_RNN_DEFECT_GRAD_CURRENT_DEVICE
  gw.copy_(gw_part.sum(0));
  gu.copy_(gu_part.sum(0));
#else
  auto gw = gw_part.sum(0).to(w.scalar_type());
  auto gu = gu_part.sum(0).to(u.scalar_type());
#endif
  return {gw, gu, gk, gv};
}

const char* defect_name() {
#if defined(CUSTOM_RNN_DEFECT_NO_GUARD)
  return "no_guard";
#elif defined(CUSTOM_RNN_DEFECT_BF16_ACCUM)
  return "bf16_accum";
#elif defined(CUSTOM_RNN_DEFECT_GRAD_CURRENT_DEVICE)
  return "grad_current_device";
#else
  return "";
#endif
}

}  // namespace custom_rnn
