// Input checks shared by the splat entry points (splat.cpp, splat_project_backward.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <sstream>

#include "common.h"

namespace gpucheck::splat {

// `t` is a contiguous CUDA tensor of `dtype` on ref's device with `shape` (-1: any size),
// else a TypeError / ValueError naming `op`, `name` and what was received.
inline void check_tensor(const at::Tensor& ref, const at::Tensor& t, const char* name,
                         std::initializer_list<int64_t> shape, const char* op,
                         at::ScalarType dtype = at::kFloat, const char* ref_name = "means") {
  check_cuda(t, op, name);
  check_same_device(ref, ref_name, t, op, name);
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": ", name, " must be ",
                   dtype == at::kFloat ? "float32 (the only dtype supported for now)" : "int32",
                   ", got ", t.scalar_type());
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
