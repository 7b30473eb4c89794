"""Builds conv2d_ext's binary module ahead of time.

With a CUDA toolkit the CPU and CUDA kernels are built; without one, a
CPU-only module with a warning. The toolkit: CUDA_HOME (or CUDA_PATH) if
set, else the first of the nvcc on PATH, /usr/local/cuda, /usr/local/cuda-*
(newest first) that has bin/nvcc and include/cuda_runtime.h. The CUDA
runtime to link: the toolkit's lib64 or lib, else the one torch's nvidia
packages carry.

Architectures: TORCH_CUDA_ARCH_LIST if set (each entry checked against
`nvcc --list-gpu-arch`); else CONV2D_EXT_ARCHS=all builds every one of
WHEEL_ARCHS that nvcc supports (the wheels); else the visible GPUs'; else,
with no GPU visible, DEFAULT_ARCHS. A 9.0 is built as sm_90a (Hopper's
wgmma kernels). MAX_JOBS is honoured as by every torch extension;
CONV2D_EXT_CPU_ONLY=1 forces the CPU-only build. CONV2D_EXT_FAMILIES=nhwc
(a comma-separated list of FAMILIES) builds those CUDA kernel families only,
for fast iteration; calls whose plan picks another then raise, and the
module warns on import.

Setting-up errors stop the build at once with what to set, before anything
compiles. setup() runs only when this file is run as a script (pip and
build run it so), so tests can import the functions.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import warnings

ROOT = os.path.dirname(os.path.abspath(__file__))
PKG = "conv2d_ext"
# Without TORCH_CUDA_ARCH_LIST and a visible GPU: sm_80 runs on every Ampere
# and Ada GPU, sm_90a on Hopper, compute_90 PTX (+PTX goes on the last one
# nvcc supports) JIT-compiles for newer GPUs. Short enough to build in CI.
DEFAULT_ARCHS = ("8.0", "9.0")
# CONV2D_EXT_ARCHS=all (the wheels): Volta to Hopper as machine code, those
# the installed nvcc supports (CUDA 13 has no sm_70).
WHEEL_ARCHS = ("7.0", "7.5", "8.0", "8.6", "8.9", "9.0")
# torch's names for architecture groups, as TORCH_CUDA_ARCH_LIST accepts them.
NAMED_ARCHS = {
    "Kepler+Tesla": "3.7", "Kepler": "3.5+PTX", "Maxwell+Tegra": "5.3",
    "Maxwell": "5.0;5.2+PTX", "Pascal": "6.0;6.1+PTX", "Volta+Tegra": "7.2",
    "Volta": "7.0+PTX", "Turing": "7.5+PTX", "Ampere+Tegra": "8.7",
    "Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX", "Hopper": "9.0+PTX",
    "Blackwell+Tegra": "11.0", "Blackwell": "10.0;10.3;12.0;12.1+PTX", "Rubin": "10.7+PTX",
}


def read_version():
    """conv2d_ext/version.py's version, plus CONV2D_EXT_LOCAL_VERSION as a
    local label (+cu130.torch2.14.1) for prebuilt wheel variants."""
    text = open(os.path.join(ROOT, PKG, "version.py")).read()
    version = re.search(r'__version__ = "([^"]+)"', text).group(1)
    local = os.environ.get("CONV2D_EXT_LOCAL_VERSION")
    return f"{version}+{local}" if local else version


def torch_minor():
    import torch

    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


# --- the CUDA toolkit and runtime ------------------------------------------


def is_toolkit(root):
    return os.path.isfile(os.path.join(root, "bin", "nvcc")) and os.path.isfile(
        os.path.join(root, "include", "cuda_runtime.h"))


def _version_key(path):
    return tuple(int(n) for n in re.findall(r"\d+", os.path.basename(path)))


def find_cuda_home(environ=os.environ, prefix="/usr/local"):
    """The toolkit's root, or None when there is none at all.

    torch guesses the root from the nvcc on PATH, which for a wrapper script
    (/usr/local/bin/nvcc) is a folder without headers or libraries, and the
    build then fails at the link, after compiling everything. So a set
    CUDA_HOME/CUDA_PATH is checked, and candidates are accepted only with
    bin/nvcc and include/cuda_runtime.h."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = environ.get(var)
        if root:
            if not is_toolkit(root):
                missing = [p for p in ("bin/nvcc", "include/cuda_runtime.h")
                           if not os.path.isfile(os.path.join(root, p))]
                raise SystemExit(
                    f"conv2d_ext: {var}={root} is not a CUDA toolkit: it has no {' and no '.join(missing)}. "
                    f"Set {var} to the toolkit's root (the folder with bin/nvcc and include/), "
                    "or CONV2D_EXT_CPU_ONLY=1 for the CPU-only module.")
            return root
    candidates = []
    nvcc = shutil.which("nvcc", path=environ.get("PATH"))
    if nvcc:
        for path in (os.path.realpath(nvcc), os.path.abspath(nvcc)):
            candidates.append(os.path.dirname(os.path.dirname(path)))
    candidates.append(os.path.join(prefix, "cuda"))
    candidates += sorted(glob.glob(os.path.join(prefix, "cuda-*")), key=_version_key, reverse=True)
    for root in candidates:
        if is_toolkit(root):
            return root
    if nvcc:
        raise SystemExit(
            f"conv2d_ext: there is an nvcc on PATH ({nvcc}), but no CUDA toolkit (bin/nvcc and "
            f"include/cuda_runtime.h) at its root nor in {prefix}/cuda or {prefix}/cuda-*. "
            "Set CUDA_HOME to the toolkit's root, or CONV2D_EXT_CPU_ONLY=1 for the CPU-only module.")
    return None


def find_cudart(cuda_home, cuda_major, search_paths=None):
    """Where the CUDA runtime to link against is: (folder, name), name None
    when -lcudart finds it there, else the versioned file to link by name.

    A toolkit installed for compiling only may lack libcudart.so; torch's
    nvidia packages carry the runtime it loads (libcudart.so.<major>)."""
    for sub in ("lib64", "lib", os.path.join("lib", "x64")):
        folder = os.path.join(cuda_home, sub)
        if os.path.exists(os.path.join(folder, "libcudart.so")):
            return folder, None
    for base in sys.path if search_paths is None else search_paths:
        for folder in sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib"))):
            if os.path.exists(os.path.join(folder, "libcudart.so")):
                return folder, None
            versioned = os.path.join(folder, f"libcudart.so.{cuda_major}")
            if os.path.exists(versioned):
                return folder, os.path.basename(versioned)
    raise SystemExit(
        f"conv2d_ext: no CUDA runtime to link against: no libcudart.so in {cuda_home}/lib64 or "
        f"{cuda_home}/lib, nor a libcudart.so.{cuda_major} in torch's nvidia packages. Install the "
        "toolkit's runtime (e.g. the cuda-cudart-dev package), set CUDA_HOME to a complete toolkit, "
        "or CONV2D_EXT_CPU_ONLY=1 for the CPU-only module.")


# --- GPU architectures -----------------------------------------------------


def nvcc_archs(nvcc):
    """The compute capabilities nvcc compiles for, as "75", "90", ...; None
    when this nvcc cannot list them."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return set(re.findall(r"compute_(\d+)", out)) or None


def arch_number(entry):
    """"9.0a+PTX" -> "90": what nvcc's compute_XX needs to exist."""
    return entry.partition("+")[0].replace(".", "").rstrip("af")


def parse_arch_list(text):
    text = text.replace(" ", ";")
    for name, archs in NAMED_ARCHS.items():  # combined names come first
        text = text.replace(name, archs)
    return [e for e in text.split(";") if e]


def with_ptx_on_last(archs):
    return archs[:-1] + [archs[-1] + "+PTX"] if archs else archs


def select_archs(candidates, supported):
    """The candidates nvcc supports, +PTX on the last."""
    archs = [a for a in candidates if supported is None or arch_number(a) in supported]
    if not archs:
        raise SystemExit(
            f"conv2d_ext: this nvcc supports none of {', '.join(candidates)} "
            f"(it lists compute_{', compute_'.join(sorted(supported, key=int))}); "
            "set TORCH_CUDA_ARCH_LIST.")
    return with_ptx_on_last(archs)


def gpu_archs(capabilities, supported):
    """The visible GPUs' architectures. A GPU newer than nvcc gets the newest
    architecture nvcc has below it, as PTX it can JIT-compile."""
    archs = []
    for major, minor in sorted(set(capabilities)):
        arch = f"{major}.{minor}"
        if supported is not None and arch_number(arch) not in supported:
            older = [int(n) for n in supported if int(n) < major * 10 + minor]
            if not older:
                raise SystemExit(f"conv2d_ext: this nvcc cannot compile for the visible GPU ({arch}).")
            n = max(older)
            arch = f"{n // 10}.{n % 10}+PTX"
        if arch not in archs:
            archs.append(arch)
    return archs


def resolve_archs(environ, supported, capabilities):
    """The TORCH_CUDA_ARCH_LIST to build, and where it came from.

    supported: nvcc's compute capabilities (nvcc_archs), or None if
    unknown; capabilities: the visible GPUs' (major, minor)."""
    explicit = environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    mode = environ.get("CONV2D_EXT_ARCHS", "")
    if mode not in ("", "all"):
        raise SystemExit(f"conv2d_ext: CONV2D_EXT_ARCHS={mode!r}: expected 'all' or nothing.")
    if explicit and explicit != "native":
        archs = parse_arch_list(explicit)
        bad = [a for a in archs if supported is not None and arch_number(a) not in supported]
        malformed = [a for a in archs if not re.fullmatch(r"\d+\.\d+[af]?(\+PTX)?", a)]
        if bad or malformed:
            raise SystemExit(
                f"conv2d_ext: TORCH_CUDA_ARCH_LIST={explicit!r} names "
                f"{', '.join(dict.fromkeys(malformed + bad))}, which this nvcc cannot compile for; "
                f"it supports {', '.join(f'{int(n) // 10}.{int(n) % 10}' for n in sorted(supported or [], key=int))}"
                " (entries like 8.0, 9.0+PTX). Change TORCH_CUDA_ARCH_LIST, or unset it for the default.")
        return ";".join(archs), "TORCH_CUDA_ARCH_LIST"
    if mode == "all" and not explicit:
        return ";".join(select_archs(WHEEL_ARCHS, supported)), "CONV2D_EXT_ARCHS=all"
    if capabilities:
        return ";".join(gpu_archs(capabilities, supported)), "the visible GPUs"
    if explicit == "native":
        raise SystemExit("conv2d_ext: TORCH_CUDA_ARCH_LIST=native, but no GPU is visible; name the architectures.")
    return ";".join(select_archs(DEFAULT_ARCHS, supported)), "the default without a visible GPU"


def hopper_arch_flags(archs):
    """Hopper's wgmma kernels need sm_90a code, which runs on compute
    capability 9.0 only. When the list names 9.0, build 9.0a in its place
    (PTX for later GPUs stays compute_90) and return every -gencode flag;
    torch adds none of its own once one is given. Empty when 9.0 is not
    named: the binary then has the mma.sync kernels only."""
    entries = [e for e in archs.replace(" ", ";").split(";") if e.partition("+")[0]]
    if not any(arch_number(e) == "90" for e in entries):
        return []
    flags = []
    for entry in entries:
        num, ptx = arch_number(entry), entry.partition("+")[2]
        code = "90a" if num == "90" else num
        flags.append(f"-gencode=arch=compute_{code},code=sm_{code}")
        if ptx == "PTX":
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


# --- the extension ---------------------------------------------------------


def cuda_home_or_none():
    """The toolkit to build with (exported as CUDA_HOME before torch's
    cpp_extension reads it at import), or None for the CPU-only module."""
    import torch

    if os.environ.get("CONV2D_EXT_CPU_ONLY", "0") == "1":
        return None
    if torch.version.cuda is None:
        warnings.warn("conv2d_ext: this torch has no CUDA support; building the CPU-only module")
        return None
    explicit = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    root = find_cuda_home()
    if root is None:
        warnings.warn("conv2d_ext: no CUDA toolkit found (set CUDA_HOME); building the CPU-only module")
        return None
    if not explicit:
        os.environ["CUDA_HOME"] = root
        print(f"conv2d_ext: using the CUDA toolkit in {root} (set CUDA_HOME to choose another)")
    return root


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


def write_build_info(with_cuda, archs, families=None):
    """Records what this binary was built against, for the import check."""
    import torch

    cuda = torch.version.cuda if with_cuda else None
    with open(os.path.join(ROOT, PKG, "_build_info.py"), "w") as f:
        f.write("# Written by setup.py at build time.\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"CUDA_VERSION = {cuda!r}\n")
        f.write(f"CUDA_ARCHS = {archs!r}\n")
        f.write(f"CUDA_FAMILIES = {list(families) if families else None!r}\n")


# The CUDA kernel families, one folder of csrc/cuda each. CONV2D_EXT_FAMILIES
# (comma-separated) builds only those, for fast iteration on one family:
# the others' launchers are then stubs that raise when the plan picks them
# (csrc/cuda/without_families.cu), so such a build fails the tests of the
# families it left out. Unset: every family. The stubs' switches go into a
# header only that file includes (FAMILIES_HEADER, not in git), so that a
# change of families recompiles it alone, not every file.
FAMILIES = ("direct", "few_channels", "implicit_gemm", "nhwc", "sm90")
FAMILIES_HEADER = os.path.join("csrc", "cuda", "families_built.h")


def select_families(environ):
    """(families to build, the macros that stub out the rest) from
    CONV2D_EXT_FAMILIES."""
    text = environ.get("CONV2D_EXT_FAMILIES", "").strip()
    if not text:
        return FAMILIES, []
    chosen = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown or not chosen:
        raise SystemExit(f"CONV2D_EXT_FAMILIES={text!r}: unknown {', '.join(unknown) or 'empty list'}; "
                         f"the families are {', '.join(FAMILIES)}")
    built = tuple(f for f in FAMILIES if f in chosen)
    return built, [f"CONV2D_EXT_WITHOUT_{f.upper()}" for f in FAMILIES if f not in built]


def write_families_header(without, root=ROOT):
    """FAMILIES_HEADER with `without`'s macros defined (none: a full
    build), rewritten only when its text changes, so that ninja leaves
    without_families.cu alone between builds of the same families."""
    text = "// Written by setup.py: the kernel families this build leaves out.\n#pragma once\n"
    text += "".join(f"#define {macro}\n" for macro in without)
    path = os.path.join(root, FAMILIES_HEADER)
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


def cuda_sources(families, root=ROOT):
    """The .cu files of csrc/cuda itself (the passes and shared pieces) and
    of the given families' folders, relative to root."""
    def found(pattern):
        return sorted(os.path.relpath(f, root) for f in glob.glob(os.path.join(root, pattern), recursive=True))

    sources = found("csrc/cuda/*.cu")
    for family in families:
        sources += found(f"csrc/cuda/{family}/**/*.cu")
    return sources


# Ninja starts compiles in the sources' order (the build.ninja that
# torch writes), so a long translation unit late in it finishes after the
# rest and sets the build's length: these,
# the longest in a clean sm_90a build's ninja log (scripts/gpu_check.sh
# keeps it), go first.
LONGEST_FIRST = (
    "csrc/cpu/blocked.cpp",
    "csrc/cuda/few_channels/wgrad.cu",
)


def build_order(sources):
    """`sources` with LONGEST_FIRST's files (those present) first, the rest
    in their order."""
    first = [f for f in LONGEST_FIRST if f in sources]
    return first + [f for f in sources if f not in first]


def make_extension():
    cuda_home = cuda_home_or_none()
    import torch
    from torch.utils import cpp_extension  # reads CUDA_HOME at import

    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
    # py_limited_api=True makes torch define Py_LIMITED_API (CPython 3.10);
    # the wheel tag below must match it.
    # -fopenmp: at::parallel_for is inline code over OpenMP in torch's
    # builds; without it every CPU kernel runs on one thread. The OpenMP
    # runtime is torch's own (libtorch_cpu loads it), so nothing is linked.
    cxx_flags = ["-O3", "-fopenmp"]
    if cuda_home is None:
        write_build_info(False, None)
        return cpp_extension.CppExtension(
            f"{PKG}._C", build_order(sources), extra_compile_args={"cxx": cxx_flags}, py_limited_api=True
        )
    cuda_major = torch.version.cuda.split(".")[0]
    cudart_dir, cudart_file = find_cudart(cuda_home, cuda_major)
    capabilities = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    archs, source = resolve_archs(os.environ, nvcc_archs(os.path.join(cuda_home, "bin", "nvcc")), capabilities)
    # torch builds this list where hopper_arch_flags gives no flags.
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    print(f"conv2d_ext: building for CUDA architectures {archs} ({source})")
    families, without = select_families(os.environ)
    if without:
        print(f"conv2d_ext: building the kernel families {', '.join(families)} only (CONV2D_EXT_FAMILIES)")
    write_build_info(True, archs, families if without else None)
    write_families_header(without)
    sources = build_order(sources + cuda_sources(families))
    nvcc_flags = ["-O3", "-lineinfo", "--expt-relaxed-constexpr", "-DCONV2D_EXT_FAMILIES_HEADER"]
    arch_flags = hopper_arch_flags(archs)
    if arch_flags:
        nvcc_flags += arch_flags
        cxx_flags.append("-DCONV2D_EXT_SM90A")
        nvcc_flags.append("-DCONV2D_EXT_SM90A")
    ext = cpp_extension.CUDAExtension(
        f"{PKG}._C",
        sources,
        include_dirs=nvidia_wheel_includes(),
        library_dirs=[cudart_dir],
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        py_limited_api=True,
    )
    if cudart_file:
        # Only libcudart.so.<major> exists there: link it by file name
        # (CUDAExtension's -lcudart would look for libcudart.so).
        ext.libraries.remove("cudart")
        ext.extra_link_args = list(ext.extra_link_args or []) + [f"-l:{cudart_file}"]
    return ext


def build_ext_class():
    from torch.utils import cpp_extension

    class BuildExtension(cpp_extension.BuildExtension):
        def finalize_options(self):
            super().finalize_options()
            # pip's editable build compiles in a temporary folder that it
            # deletes, even after a failure; in build/ a rerun compiles only
            # what changed.
            if getattr(self, "editable_mode", False):
                self.build_temp = os.path.join(ROOT, "build", "temp-editable")

        def build_extension(self, ext):
            # setuptools sorts an extension's sources before compiling them
            # (for reproducible builds); the compile (torch's ninja writer,
            # installed by then) gets them in build_order instead.
            compile_sorted = self.compiler.compile

            def compile_in_build_order(sources, *args, **kwargs):
                return compile_sorted(build_order(list(sources)), *args, **kwargs)

            self.compiler.compile = compile_in_build_order
            try:
                super().build_extension(ext)
            finally:
                self.compiler.compile = compile_sorted

    return BuildExtension


def main():
    from setuptools import find_packages, setup

    ext = make_extension()  # first: it exports CUDA_HOME for cpp_extension
    setup(
        name=PKG,
        version=read_version(),
        description="Fast 2-D convolution for PyTorch: forward, dgrad and wgrad CUDA kernels",
        packages=find_packages(include=[PKG, f"{PKG}.*"]),
        ext_modules=[ext],
        cmdclass={"build_ext": build_ext_class()},
        options={"bdist_wheel": {"py_limited_api": "cp310"}},
        python_requires=">=3.10",
        # The binary works only with the torch minor it was built against.
        install_requires=[f"torch=={torch_minor()}.*"],
        extras_require={
            "test": ["pytest", "hypothesis", "expecttest", "numpy"],
            "benchmark": ["torchvision"],
        },
    )


if __name__ == "__main__":
    main()
