// Entry points of the fused SSIM kernels: device guard, input checks, allocation, launch.
// Schemas and registrations at the end; kernels in ssim_cuda.cu and ssim_backward.cu.
#include "ssim/ssim.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <tuple>
#include <vector>

#include "common.h"
#include "library.h"

namespace gpucheck {
namespace {

constexpr const char* kForward = "gpucheck::ssim_forward";
constexpr const char* kBackward = "gpucheck::ssim_backward";
constexpr const char* kTrain = "gpucheck::ssim_train";
constexpr const char* kScale = "gpucheck::ssim_scale_";

struct Options {
  bool valid;
  bool mean;
};

Options parse_options(std::string_view padding, std::string_view reduction, const char* op) {
  TORCH_CHECK(padding == "same" || padding == "valid", op,
              ": padding must be \"same\" or \"valid\", got \"", padding, "\"");
  TORCH_CHECK(reduction == "mean" || reduction == "none", op,
              ": reduction must be \"mean\" or \"none\", got \"", reduction, "\"");
  return {padding == "valid", reduction == "mean"};
}

ssim::Dtype to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ssim::Dtype::kFloat32;
    case at::kHalf: return ssim::Dtype::kFloat16;
    case at::kBFloat16: return ssim::Dtype::kBFloat16;
    case at::kDouble: return ssim::Dtype::kFloat64;
    default: break;
  }
  TORCH_CHECK(false, "gpucheck::ssim: images must be float32, float16, bfloat16 or float64, got ",
              t);
}

// img1 must already be known to be a CUDA tensor (the guard needs its device).
void check_images(const at::Tensor& img1,  // [B, C, H, W]
                  const at::Tensor& img2,  // [B, C, H, W]
                  bool valid, const char* op) {
  check_cuda(img2, op, "img2");
  check_same_device(img1, "img1", img2, op, "img2");
  TORCH_CHECK(img1.dim() == 4, op, ": img1 must be [B, C, H, W], got ", img1.sizes());
  TORCH_CHECK(img2.sizes() == img1.sizes(), op, ": img2 must have img1's shape ", img1.sizes(),
              ", got ", img2.sizes());
  const auto t = img1.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble, op,
              ": img1 must be float32, float16, bfloat16 or float64, got ", t);
  TORCH_CHECK(img2.scalar_type() == t, op, ": img2 must have img1's dtype ", t, ", got ",
              img2.scalar_type());
  TORCH_CHECK(img1.numel() > 0, op, ": images must not be empty, got ", img1.sizes());
  constexpr int64_t kMaxSide = std::numeric_limits<int>::max() / 2;
  TORCH_CHECK(img1.size(2) <= kMaxSide && img1.size(3) <= kMaxSide, op,
              ": H and W must be below ", kMaxSide, ", got ", img1.sizes());
  TORCH_CHECK(!valid || (img1.size(2) >= 11 && img1.size(3) >= 11), op,
              ": padding=\"valid\" needs H, W >= 11, got ", img1.sizes());
}

ssim::Geometry geometry(const at::Tensor& img,  // [B, C, H, W]
                        bool valid) {
  return {img.size(0) * img.size(1), static_cast<int>(img.size(2)),
          static_cast<int>(img.size(3)), valid};
}

void check_grid(int64_t blocks, const char* op, const at::Tensor& img) {
  TORCH_CHECK(blocks <= std::numeric_limits<int>::max(), op, ": images too large (",
              img.sizes(), " needs ", blocks, " thread blocks)");
}

void check_cuda_call(cudaError_t err) { C10_CUDA_CHECK(err); }

// The stream of every launch: the caller's current stream on the input's device (the guard
// has made that device current). Building with -DGPUCHECK_DEFECT_LEGACY_STREAM launches on
// stream 0, the legacy default stream, instead: not ordered after the caller's work on a
// non-blocking stream (torch's streams are), so the kernel may read inputs not yet written.
// That defect exists only for the wrong-stream detector's self-test; never define it in a
// release build.
cudaStream_t launch_stream() {
#ifdef GPUCHECK_DEFECT_LEGACY_STREAM
  return nullptr;
#else
  return c10::cuda::getCurrentCUDAStream();
#endif
}

// The mean of the SSIM map (0-dim, x's dtype) from the sums of its cells (`partials`, written
// by the forward or the backward kernel): one reduction kernel.
at::Tensor mean_of_cells(const at::Tensor& x, const at::Tensor& partials, const ssim::Geometry& geo,
                         ssim::Dtype dtype, cudaStream_t stream) {
  at::Tensor out = at::empty({}, x.options());
  const double count = static_cast<double>(geo.planes) * geo.out_height() * geo.out_width();
  check_cuda_call(ssim::launch_mean(dtype, partials.data_ptr(), partials.numel(), 1.0 / count,
                                    out.data_ptr(), stream));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// Scratch for the sums of the map's cells ([mean_cells], float32, float64 for float64).
at::Tensor cell_sums(const at::Tensor& x, const ssim::Geometry& geo) {
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::empty({ssim::mean_cells(geo)}, x.options().dtype(acc));
}

// Returns the SSIM map ([B, C, H', W'], the images' dtype) or its mean (0-dim).
at::Tensor ssim_forward(const at::Tensor& img1,  // [B, C, H, W]
                        const at::Tensor& img2,  // [B, C, H, W]
                        std::string_view padding, std::string_view reduction) {
  check_cuda(img1, kForward, "img1");
  GPUCHECK_DEVICE_GUARD(img1);
  const Options opt = parse_options(padding, reduction, kForward);
  check_images(img1, img2, opt.valid, kForward);
  const at::Tensor x = img1.contiguous();
  const at::Tensor y = img2.contiguous();
  const ssim::Geometry geo = geometry(x, opt.valid);
  const ssim::Dtype dtype = to_dtype(x.scalar_type());
  check_grid(ssim::forward_blocks(dtype, geo, opt.mean), kForward, x);
  const cudaStream_t stream = launch_stream();

  if (!opt.mean) {
    at::Tensor map =
        at::empty({x.size(0), x.size(1), geo.out_height(), geo.out_width()}, x.options());
    check_cuda_call(
        ssim::launch_forward(dtype, x.data_ptr(), y.data_ptr(), geo, map.data_ptr(), nullptr,
                             stream));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return map;
  }
  at::Tensor partials = cell_sums(x, geo);
  check_cuda_call(ssim::launch_forward(dtype, x.data_ptr(), y.data_ptr(), geo, nullptr,
                                       partials.data_ptr(), stream));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return mean_of_cells(x, partials, geo, dtype, stream);
}

// Returns (d loss / d img1, d loss / d img2); the second is an empty [0] tensor unless
// need_grad2.
std::tuple<at::Tensor, at::Tensor> ssim_backward(
    const at::Tensor& grad,  // [] (reduction mean) or [B, C, H', W'] (reduction none)
    const at::Tensor& img1,  // [B, C, H, W]
    const at::Tensor& img2,  // [B, C, H, W]
    std::string_view padding, std::string_view reduction, bool need_grad2) {
  check_cuda(img1, kBackward, "img1");
  GPUCHECK_DEVICE_GUARD(img1);
  const Options opt = parse_options(padding, reduction, kBackward);
  check_images(img1, img2, opt.valid, kBackward);
  check_cuda(grad, kBackward, "grad");
  check_same_device(img1, "img1", grad, kBackward, "grad");
  TORCH_CHECK(grad.scalar_type() == img1.scalar_type(), kBackward,
              ": grad must have the images' dtype ", img1.scalar_type(), ", got ",
              grad.scalar_type());
  const at::Tensor x = img1.contiguous();
  const at::Tensor y = img2.contiguous();
  const ssim::Geometry geo = geometry(x, opt.valid);
  if (opt.mean) {
    TORCH_CHECK(grad.numel() == 1, kBackward,
                ": with reduction=\"mean\" grad must have one element, got ", grad.sizes());
  } else {
    const std::vector<int64_t> want = {x.size(0), x.size(1), geo.out_height(), geo.out_width()};
    TORCH_CHECK(grad.sizes() == at::IntArrayRef(want), kBackward, ": grad must be ",
                at::IntArrayRef(want), ", got ", grad.sizes());
  }
  const at::Tensor g = grad.contiguous();
  const int64_t blocks = ssim::backward_blocks(geo);
  check_grid(blocks, kBackward, x);
  const ssim::Dtype dtype = to_dtype(x.scalar_type());
  at::Tensor grad1 = at::empty_like(x);
  at::Tensor grad2 = need_grad2 ? at::empty_like(y) : at::empty({0}, y.options());
  const double count = static_cast<double>(geo.planes) * geo.out_height() * geo.out_width();
  check_cuda_call(ssim::launch_backward(dtype, g.data_ptr(), opt.mean, 1.0 / count,
                                        x.data_ptr(), y.data_ptr(), geo, grad1.data_ptr(),
                                        need_grad2 ? grad2.data_ptr() : nullptr, nullptr,
                                        launch_stream()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {grad1, grad2};
}

// The training step's forward with reduction = mean: returns (mean SSIM, grad_scale *
// d mean / d img1, grad_scale * d mean / d img2); the last is an empty [0] tensor unless
// need_grad2. Two kernels from one op call: the backward kernel, for an upstream gradient of
// grad_scale, which also writes the sums of the map's cells (the same values, bit for bit, as
// the forward kernel's: the mean equals ssim_forward's), then the mean of those. No forward
// kernel: the backward recomputes the moments anyway. The autograd Function below runs this
// ahead, while the host is still in the autograd engine, and its backward pass only scales the
// gradient (ssim_scale_).
std::tuple<at::Tensor, at::Tensor, at::Tensor> ssim_train(
    const at::Tensor& img1,  // [B, C, H, W]
    const at::Tensor& img2,  // [B, C, H, W]
    std::string_view padding, double grad_scale, bool need_grad2) {
  check_cuda(img1, kTrain, "img1");
  GPUCHECK_DEVICE_GUARD(img1);
  const Options opt = parse_options(padding, "mean", kTrain);
  check_images(img1, img2, opt.valid, kTrain);
  TORCH_CHECK(grad_scale != 0 && std::isfinite(grad_scale), kTrain,
              ": grad_scale must be nonzero and finite, got ", grad_scale);
  const at::Tensor x = img1.contiguous();
  const at::Tensor y = img2.contiguous();
  const ssim::Geometry geo = geometry(x, opt.valid);
  const ssim::Dtype dtype = to_dtype(x.scalar_type());
  check_grid(ssim::backward_blocks(geo), kTrain, x);
  const cudaStream_t stream = launch_stream();
  at::Tensor partials = cell_sums(x, geo);
  at::Tensor grad1 = at::empty_like(x);
  at::Tensor grad2 = need_grad2 ? at::empty_like(y) : at::empty({0}, y.options());
  const double count = static_cast<double>(geo.planes) * geo.out_height() * geo.out_width();
  check_cuda_call(ssim::launch_backward(dtype, nullptr, true, grad_scale / count, x.data_ptr(),
                                        y.data_ptr(), geo, grad1.data_ptr(),
                                        need_grad2 ? grad2.data_ptr() : nullptr,
                                        partials.data_ptr(), stream));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  at::Tensor out = mean_of_cells(x, partials, geo, dtype, stream);
  return {out, grad1, grad2};
}

// In place: grad *= upstream * factor (computed in float32 for 16-bit grad, float64 for
// float64). Returns nothing (the schema marks grad as mutated).
void ssim_scale_(const at::Tensor& grad,      // any shape, contiguous
                 const at::Tensor& upstream,  // one element, grad's dtype
                 double factor) {
  check_cuda(grad, kScale, "grad");
  GPUCHECK_DEVICE_GUARD(grad);
  check_cuda(upstream, kScale, "upstream");
  check_same_device(grad, "grad", upstream, kScale, "upstream");
  TORCH_CHECK(grad.scalar_type() == upstream.scalar_type(), kScale,
              ": upstream must have grad's dtype ", grad.scalar_type(), ", got ",
              upstream.scalar_type());
  TORCH_CHECK(upstream.numel() == 1, kScale, ": upstream must have one element, got ",
              upstream.sizes());
  TORCH_CHECK(grad.is_contiguous(), kScale, ": grad must be contiguous, got strides ",
              grad.strides());
  const ssim::Dtype dtype = to_dtype(grad.scalar_type());
  const at::Tensor u = upstream.contiguous();
  check_cuda_call(ssim::launch_scale(dtype, grad.data_ptr(), grad.numel(), u.data_ptr(), factor,
                                     launch_stream()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// --- Autograd (C++: no Python runs per training step) ---
//
// The op namespace as a string ("gpucheck", or a defect build's own: see library.h).
#define GPUCHECK_STR_(x) #x
#define GPUCHECK_STR(x) GPUCHECK_STR_(x)
constexpr const char* kForwardName = GPUCHECK_STR(GPUCHECK_LIBRARY) "::ssim_forward";
constexpr const char* kBackwardName = GPUCHECK_STR(GPUCHECK_LIBRARY) "::ssim_backward";
constexpr const char* kTrainName = GPUCHECK_STR(GPUCHECK_LIBRARY) "::ssim_train";
constexpr const char* kScaleName = GPUCHECK_STR(GPUCHECK_LIBRARY) "::ssim_scale_";

using ForwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, std::string_view,
                              std::string_view);
using BackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&, std::string_view,
                                                       std::string_view, bool);
using TrainSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&,
                                                                const at::Tensor&,
                                                                std::string_view, double, bool);
using ScaleSig = void(const at::Tensor&, const at::Tensor&, double);

// The ops' typed handles, looked up once. All are called through the dispatcher (not as
// the C++ functions above) so that fake tensors, torch.compile and the wrong-stream detector
// see them as ops.
template <class Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}
const c10::TypedOperatorHandle<ForwardSig>& forward_op() {
  static const auto op = find_op<ForwardSig>(kForwardName);
  return op;
}
const c10::TypedOperatorHandle<BackwardSig>& backward_op() {
  static const auto op = find_op<BackwardSig>(kBackwardName);
  return op;
}
const c10::TypedOperatorHandle<TrainSig>& train_op() {
  static const auto op = find_op<TrainSig>(kTrainName);
  return op;
}
const c10::TypedOperatorHandle<ScaleSig>& scale_op() {
  static const auto op = find_op<ScaleSig>(kScaleName);
  return op;
}

// The factor of the gradient computed ahead (a power of two). float16: d mean / d img is about
// 1 / (B C H W) per pixel, subnormal or zero in float16, so it is computed and stored times
// 2^(floor(log2 of the map's pixel count) - 4), i.e. about d sum / d img / 16 (far from
// float16's overflow at 65504); the in-place scale divides it out in float32, where it is
// exact. Other dtypes have float32's (or float64's) range: 1.
double ahead_grad_scale(const at::Tensor& img,  // [B, C, H, W]
                        bool valid) {
  if (img.scalar_type() != at::kHalf || img.dim() != 4) return 1.0;  // a bad shape: the op raises
  // Symbolic sizes (torch.compile with dynamic shapes): the factor specializes on them.
  const auto sizes = img.sym_sizes();
  auto size = [&](int i) { return sizes[i].guard_int(__FILE__, __LINE__); };
  const int64_t h = valid ? size(2) - 10 : size(2);
  const int64_t w = valid ? size(3) - 10 : size(3);
  const int64_t count = size(0) * size(1) * h * w;
  int exponent = 0;
  while (exponent < 62 && (int64_t{2} << exponent) <= count) ++exponent;  // floor(log2)
  return std::ldexp(1.0, std::max(0, exponent - 4));
}

// Forward saves references to the two images (no memory: they are inputs) and the two options. With
// reduction = mean (the training loss), the upstream gradient is a scalar, so the forward (one op,
// ssim_train) launches the backward kernel, which also sums the map for the mean, for an upstream
// gradient of grad_scale = -ahead_grad_scale (-1, or minus a power of two for float16): the
// upstream gradient of the usual loss, 1 - ssim, is -1. The backward pass then only scales that
// gradient by the actual upstream gradient / grad_scale (ssim_scale_: an elementwise kernel whose
// threads return at once when that factor is 1, i.e. for 1 - ssim in float32, bfloat16 and
// float64). The GPU runs the backward kernel while the host goes through the autograd engine (about
// 0.15-0.2 ms of host time per step on the H200 machine, most of it the hand-over to the engine's
// device thread), instead of waiting for it. The buffer is the gradient that the backward returns,
// so peak memory is unchanged; it is held from the forward to the backward. A second backward
// through the same graph (retain_graph) recomputes with ssim_backward. reduction = none:
// ssim_backward in the backward pass (the upstream gradient is a map, known only then).
class SsimFunction : public torch::autograd::Function<SsimFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx,
                            const at::Tensor& img1,  // [B, C, H, W]
                            const at::Tensor& img2,  // [B, C, H, W]
                            std::string_view padding, std::string_view reduction) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({img1, img2});
    ctx->saved_data["valid"] = padding == "valid";
    ctx->saved_data["mean"] = reduction == "mean";
    if (reduction != "mean") return forward_op().call(img1, img2, padding, reduction);
    const double grad_scale = -ahead_grad_scale(img1, padding == "valid");
    auto [out, grad1, grad2] =
        train_op().call(img1, img2, padding, grad_scale, img2.requires_grad());
    ctx->saved_data["grad1"] = std::move(grad1);
    ctx->saved_data["grad2"] = std::move(grad2);
    ctx->saved_data["factor"] = 1.0 / grad_scale;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const bool need1 = ctx->needs_input_grad(0);
    const bool need2 = ctx->needs_input_grad(1);
    torch::autograd::variable_list out(4);
    auto ahead = ctx->saved_data.find("grad1");
    if (ahead != ctx->saved_data.end()) {  // first backward after a mean forward
      at::Tensor grad1 = ahead->second.toTensor();
      at::Tensor grad2 = ctx->saved_data["grad2"].toTensor();
      ctx->saved_data.erase("grad1");
      ctx->saved_data.erase("grad2");
      // grad1/2 hold grad_scale * d(mean)/d(img): scale them in place by the upstream
      // gradient / grad_scale (the identity for the usual upstream gradient of 1 - ssim, -1,
      // and grad_scale -1; exact for +-1: bitwise the recomputed gradient).
      const bool have2 = grad2.dim() == 4;  // else the empty [0] placeholder
      const double factor = ctx->saved_data["factor"].toDouble();
      if (need1) scale_op().call(grad1, grads[0], factor);
      if (need2 && have2) scale_op().call(grad2, grads[0], factor);
      if (need1) out[0] = std::move(grad1);
      if (need2 && have2) out[1] = std::move(grad2);
      if (!need2 || have2) return out;
      // img2 needs a gradient the forward did not compute (it did not require grad then).
    }
    if (!need1 && !need2) return out;
    const auto saved = ctx->get_saved_variables();
    const bool valid = ctx->saved_data["valid"].toBool();
    const bool mean = ctx->saved_data["mean"].toBool();
    auto [grad1, grad2] = backward_op().call(grads[0], saved[0], saved[1],
                                             valid ? "valid" : "same", mean ? "mean" : "none",
                                             need2);
    if (need1 && !out[0].defined()) out[0] = std::move(grad1);
    if (need2) out[1] = std::move(grad2);
    return out;
  }
};

// The Autograd kernel of ssim_forward. Without a graph to record (grad mode off, or no input
// requiring grad) it goes straight to the CUDA kernel.
at::Tensor ssim_forward_autograd(const at::Tensor& img1,  // [B, C, H, W]
                                 const at::Tensor& img2,  // [B, C, H, W]
                                 std::string_view padding, std::string_view reduction) {
  if (!at::GradMode::is_enabled() || !(img1.requires_grad() || img2.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView below;
    return forward_op().call(img1, img2, padding, reduction);
  }
  return SsimFunction::apply(img1, img2, padding, reduction);
}

}  // namespace
}  // namespace gpucheck

// The schemas of its ops.
GPUCHECK_TORCH_LIBRARY_FRAGMENT(m) {
  m.def("ssim_forward(Tensor img1, Tensor img2, str padding, str reduction) -> Tensor");
  m.def(
      "ssim_backward(Tensor grad, Tensor img1, Tensor img2, str padding, str reduction, "
      "bool need_grad2) -> (Tensor, Tensor)");
  // The training step with reduction = mean: (mean, grad_scale * d mean / d img1, the same
  // for img2 or an empty [0] tensor), and the in-place scale of such a gradient.
  m.def(
      "ssim_train(Tensor img1, Tensor img2, str padding, float grad_scale, bool need_grad2) "
      "-> (Tensor, Tensor, Tensor)");
  m.def("ssim_scale_(Tensor(a!) grad, Tensor upstream, float factor) -> ()");
}

GPUCHECK_TORCH_LIBRARY_IMPL(CUDA, m) {
  m.impl("ssim_forward", &gpucheck::ssim_forward);
  m.impl("ssim_backward", &gpucheck::ssim_backward);
  m.impl("ssim_train", &gpucheck::ssim_train);
  m.impl("ssim_scale_", &gpucheck::ssim_scale_);
}

GPUCHECK_TORCH_LIBRARY_IMPL(Autograd, m) {
  m.impl("ssim_forward", &gpucheck::ssim_forward_autograd);
}
