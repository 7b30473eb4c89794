"""Builds conv2d_ext's binary module ahead of time.

With a CUDA toolkit (found by torch.utils.cpp_extension) the CPU and CUDA
kernels are built; without one, a CPU-only module with a warning.
Honours TORCH_CUDA_ARCH_LIST and MAX_JOBS as every torch extension does;
CONV2D_EXT_CPU_ONLY=1 forces the CPU-only build.
"""
import glob
import os
import re
import sys
import warnings

import torch
from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))
PKG = "conv2d_ext"
# Architectures when TORCH_CUDA_ARCH_LIST is unset and no GPU is visible:
# Volta to Hopper as machine code, PTX for newer GPUs.
DEFAULT_ARCHS = "7.0;7.5;8.0;8.6;8.9;9.0+PTX"


def read_version():
    """conv2d_ext/version.py's version, plus CONV2D_EXT_LOCAL_VERSION as a
    local label (+cu130.torch2.14.1) for prebuilt wheel variants."""
    text = open(os.path.join(ROOT, PKG, "version.py")).read()
    version = re.search(r'__version__ = "([^"]+)"', text).group(1)
    local = os.environ.get("CONV2D_EXT_LOCAL_VERSION")
    return f"{version}+{local}" if local else version


def torch_minor():
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def use_cuda():
    if os.environ.get("CONV2D_EXT_CPU_ONLY", "0") == "1":
        return False
    if torch.version.cuda is None:
        warnings.warn("conv2d_ext: this torch has no CUDA support; building the CPU-only module")
        return False
    if cpp_extension.CUDA_HOME is None:
        warnings.warn("conv2d_ext: no CUDA toolkit found (set CUDA_HOME); building the CPU-only module")
        return False
    return True


def nvidia_wheel_includes():
    """Header folders of the nvidia-* wheels that torch depends on.

    ATen's CUDA headers include cuBLAS and cuSPARSE headers, which a bare
    toolkit may lack; torch's own pip dependencies carry them."""
    dirs = []
    for base in sys.path:
        for inc in glob.glob(os.path.join(base, "nvidia", "*", "include")):
            if os.path.exists(os.path.join(inc, "cublas_v2.h")) and inc not in dirs:
                dirs.append(inc)
    return dirs


def write_build_info(with_cuda, archs):
    """Records what this binary was built against, for the import check."""
    cuda = torch.version.cuda if with_cuda else None
    with open(os.path.join(ROOT, PKG, "_build_info.py"), "w") as f:
        f.write("# Written by setup.py at build time.\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"CUDA_VERSION = {cuda!r}\n")
        f.write(f"CUDA_ARCHS = {archs!r}\n")


def hopper_arch_flags(archs):
    """Hopper's wgmma kernels need sm_90a code, which runs on compute
    capability 9.0 only. When the list names 9.0, build 9.0a in its place
    (PTX for later GPUs stays compute_90) and return every -gencode flag;
    torch adds none of its own once one is given. Empty when 9.0 is not
    named: the binary then has the mma.sync kernels only."""
    entries = archs.replace(" ", ";").split(";")
    if not any(e.split("+")[0] in ("9.0", "9.0a") for e in entries):
        return []
    flags = []
    for entry in entries:
        version, _, ptx = entry.partition("+")
        if not version:
            continue
        num = version.replace(".", "").rstrip("a")
        code = "90a" if num == "90" else num
        flags.append(f"-gencode=arch=compute_{code},code=sm_{code}")
        if ptx == "PTX":
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def make_extension():
    with_cuda = use_cuda()
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
    # py_limited_api=True makes torch define Py_LIMITED_API (CPython 3.10);
    # the wheel tag below must match it.
    cxx_flags = ["-O3"]
    if not with_cuda:
        write_build_info(False, None)
        return cpp_extension.CppExtension(
            f"{PKG}._C", sources, extra_compile_args={"cxx": cxx_flags}, py_limited_api=True
        )
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCHS
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "native")
    write_build_info(True, archs)
    sources += sorted(glob.glob("csrc/cuda/*.cu"))
    nvcc_flags = ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]
    arch_flags = hopper_arch_flags(archs)
    if arch_flags:
        nvcc_flags += arch_flags
        cxx_flags.append("-DCONV2D_EXT_SM90A")
        nvcc_flags.append("-DCONV2D_EXT_SM90A")
    return cpp_extension.CUDAExtension(
        f"{PKG}._C",
        sources,
        include_dirs=nvidia_wheel_includes(),
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        py_limited_api=True,
    )


setup(
    name=PKG,
    version=read_version(),
    description="Fast 2-D convolution for PyTorch: forward, dgrad and wgrad CUDA kernels",
    packages=find_packages(include=[PKG, f"{PKG}.*"]),
    ext_modules=[make_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    python_requires=">=3.10",
    # The binary works only with the torch minor it was built against.
    install_requires=[f"torch=={torch_minor()}.*"],
)
