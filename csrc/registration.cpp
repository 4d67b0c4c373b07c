// gpucheck's extension: its Python module and its operator library. Each kernel declares its
// ops' schemas (GPUCHECK_TORCH_LIBRARY_FRAGMENT) and registers their CUDA implementations
// (GPUCHECK_TORCH_LIBRARY_IMPL) in its own entry-point file (csrc/<kernel>/<kernel>.cpp), so
// that a kernel is added without editing this file; Python calls them as
// torch.ops.gpucheck.<op>.
#include <Python.h>
#include <torch/library.h>

#include "library.h"

// `import gpucheck._C` loads this library, whose kernels' files register the ops; the module
// itself is empty (the pattern of pytorch/extension-cpp).
extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

// The library itself: no op of its own. Claiming it here makes a second library that loads
// under the same name (another build of these sources in one process) fail loudly.
GPUCHECK_TORCH_LIBRARY(m) {}
