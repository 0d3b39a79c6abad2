"""Ahead-of-time build of lltm._C.

    pip install --no-build-isolation .        # or -e . for development

Environment switches:
    USE_CUDA=0|1   force the CPU-only or the CUDA build (default: CUDA when
                   torch is a CUDA build and a CUDA toolkit is found)
    DEBUG=1        -O0 -g (and -G for device code)
    LLTM_STEP_CLOCKS=1  profiling build: the persistent sequence kernels
                   print the mean cycles of each phase of a step
    LLTM_NO_EXTENSION=1  install the Python package only (`make` does this for
                   its editable install, then compiles lltm._C once in place
                   with `setup.py build_ext --inplace`, objects kept in build/)
    MAX_JOBS, TORCH_CUDA_ARCH_LIST are read by torch.utils.cpp_extension;
    TORCH_CUDA_ARCH_LIST defaults to "8.0;8.6;8.9;9.0+PTX" (every supported
    GPU, PTX for newer ones).
"""

import importlib.util
import os

from setuptools import setup
from torch.utils import cpp_extension


def _load_sources_module():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lltm", "_sources.py")
    spec = importlib.util.spec_from_file_location("lltm_sources", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extension():
    src = _load_sources_module()
    with_cuda = src.want_cuda()
    debug = os.environ.get("DEBUG", "0") == "1"
    root = os.path.dirname(os.path.abspath(__file__))
    sources = [os.path.relpath(p, root) for p in src.sources(with_cuda)]
    # A changed header rebuilds too (build_ext compares these with lltm/_C*.so;
    # ninja then recompiles only the objects whose dependencies changed).
    depends = [os.path.relpath(p, root) for p in src.headers()]
    kind = cpp_extension.CUDAExtension if with_cuda else cpp_extension.CppExtension
    extra = {"cxx": src.cxx_flags(with_cuda, debug)}
    if with_cuda:
        extra["nvcc"] = src.nvcc_flags(debug)
        src.default_cuda_arch_list()
    return kind("lltm._C", sources, depends=depends, extra_compile_args=extra, extra_link_args=src.link_flags())


setup(
    ext_modules=[] if os.environ.get("LLTM_NO_EXTENSION") == "1" else [_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
