// The WKV entry points as torch ops (namespace custom_rnn) and as a pybind11 module.
#include "wkv.h"

#include <torch/extension.h>

TORCH_LIBRARY(custom_rnn, m) {
  m.def("wkv(Tensor w, Tensor u, Tensor k, Tensor v) -> Tensor");
  m.def("wkv_backward(Tensor w, Tensor u, Tensor k, Tensor v, Tensor gy) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(custom_rnn, CUDA, m) {
  m.impl("wkv", &custom_rnn::wkv_forward);
  m.impl("wkv_backward", &custom_rnn::wkv_backward);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "WKV recurrence as plain pybind11 functions (the same entry points as the op)";
  m.def("forward", &custom_rnn::wkv_forward, "y = wkv(w, u, k, v)");
  m.def("backward", &custom_rnn::wkv_backward, "(dw, du, dk, dv) = wkv_backward(w, u, k, v, dy)");
  m.attr("DEFECT") = custom_rnn::defect_name();  // the defect of this build ("": none)
}
