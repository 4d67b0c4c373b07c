// Input checks shared by the splat entry points (splat.cpp, splat_project_backward.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

#include "common.h"
#include "splat/splat.h"

namespace gpucheck::splat {

// Why the camera must be float32 (in the messages of the dtype checks).
constexpr const char* kCameraDtype =
    " (the camera stays float32 whatever the Gaussian parameters' dtype)";

inline const char* dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kInt: return "int32";
    default: return c10::toString(dtype);
  }
}

// The dtype of the Gaussian parameters, from `means` (float32, bfloat16 or float16; else a
// TypeError naming op).
inline Scalar parameter_scalar(const at::Tensor& means, const char* op) {
  switch (means.scalar_type()) {
    case at::kFloat: return Scalar::kFloat32;
    case at::kBFloat16: return Scalar::kBFloat16;
    case at::kHalf: return Scalar::kFloat16;
    default:
      TORCH_CHECK_TYPE(false, op, ": means must be float32, bfloat16 or float16 (the Gaussian "
                       "parameters' dtype), got ", means.scalar_type());
  }
  return Scalar::kFloat32;  // unreachable
}

// What a parameter's dtype check adds when the parameters are not all of means' dtype.
inline std::string same_dtype_as_means(const at::Tensor& means) {
  return std::string(" like means (the Gaussian parameters means, scales, rotations, "
                     "opacities, colors / sh and background share one dtype: float32, "
                     "bfloat16 or float16; means is ") + dtype_name(means.scalar_type()) + ")";
}

// `t` is a contiguous CUDA tensor of `dtype` on ref's device with `shape` (-1: any size),
// else a TypeError / ValueError naming `op`, `name` and what was received (`why`: added to
// the dtype message).
inline void check_tensor(const at::Tensor& ref, const at::Tensor& t, const char* name,
                         std::initializer_list<int64_t> shape, const char* op,
                         at::ScalarType dtype = at::kFloat, const char* ref_name = "means",
                         const std::string& why = "") {
  check_cuda(t, op, name);
  check_same_device(ref, ref_name, t, op, name);
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype_name(dtype),
                   why, ", got ", t.scalar_type());
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  int d = 0;
  for (const int64_t s : shape) {
    ok = ok && (s < 0 || t.size(d) == s);  // s < 0: any size
    ++d;
  }
  std::ostringstream want;
  want << "[";
  d = 0;
  for (const int64_t s : shape) {
    want << (d++ ? ", " : "");
    if (s < 0) want << (d == 1 ? "N" : "K"); else want << s;  // d: already incremented
  }
  want << "]";
  TORCH_CHECK_VALUE(ok, op, ": ", name, " must be ", want.str(), ", got ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ",
                    t.strides(), " for sizes ", t.sizes(), " (call .contiguous())");
}

}  // namespace gpucheck::splat
