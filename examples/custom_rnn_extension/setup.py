"""Build the example extension on its own: ``pip install --no-build-isolation -e .``
(``TORCH_CUDA_ARCH_LIST=9.0`` for H100/H200; ``CUSTOM_RNN_DEFECT=no_guard`` (or
``bf16_accum``, ``grad_current_device``) plants a defect)."""

import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

DEFECTS = ("no_guard", "bf16_accum", "grad_current_device")
defect = os.environ.get("CUSTOM_RNN_DEFECT") or None
if defect is not None and defect not in DEFECTS:
    raise SystemExit(f"CUSTOM_RNN_DEFECT={defect!r}: known defects are {', '.join(DEFECTS)}")
flags = [] if defect is None else [f"-DCUSTOM_RNN_DEFECT_{defect.upper()}"]

setup(
    name="custom-rnn-example",
    version="0.1.0",
    packages=["custom_rnn"],
    ext_modules=[
        CUDAExtension(
            "custom_rnn._C",
            ["csrc/bindings.cpp", "csrc/wkv.cpp", "csrc/wkv_cuda.cu"],
            extra_compile_args={"cxx": ["-O3", *flags], "nvcc": ["-O3", "-lineinfo", *flags]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
