"""CMakeLists.txt's CUDA configuration, configured but not built: the
-gencode flags and the sm_90a define that reach nvcc are those setup.py
builds with (tests/test_setup.py checks setup.py's own choices). A few
seconds a configuration; skipped without cmake, a CUDA build of torch, or a
CUDA toolkit that torch's CMake files accept."""
import importlib.util
import json
import os
import re
import shutil
import subprocess

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = os.path.join(ROOT, "setup.py")
CMAKE = shutil.which("cmake")


def _toolkit():
    """The toolkit CMakeLists.txt would take where CUDA_HOME names none;
    None unless torch's CMake files can use it (they need the shared
    runtime, which a toolkit for compiling only may lack)."""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if not root or not os.path.isfile(os.path.join(root, "bin", "nvcc")):
            continue
        if not os.path.isfile(os.path.join(root, "include", "cuda_runtime.h")):
            continue
        if any(os.path.exists(os.path.join(root, lib, "libcudart.so")) for lib in ("lib64", "lib")):
            return root
    return None


TOOLKIT = _toolkit()
if not (os.path.exists(os.path.join(ROOT, "CMakeLists.txt")) and os.path.exists(SETUP)):
    pytest.skip("no CMakeLists.txt and setup.py beside the tests", allow_module_level=True)
if CMAKE is None:
    pytest.skip("no cmake", allow_module_level=True)
if torch.version.cuda is None:
    pytest.skip("a CPU-only torch: its CMake files have no CUDA", allow_module_level=True)
if TOOLKIT is None:
    pytest.skip("no CUDA toolkit with its shared runtime (CUDA_HOME, /usr/local/cuda)", allow_module_level=True)

spec = importlib.util.spec_from_file_location("conv2d_ext_setup_for_cmake", SETUP)
setup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup)  # defines the functions; setup() runs only as a script


def configure(build, *args, **environ):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA_ARCH_LIST", "CONV2D_EXT_ARCHS", "CUDAARCHS", "CUDACXX", "CUDA_PATH")}
    env["CUDA_HOME"] = TOOLKIT
    env.update(environ)
    return subprocess.run(
        [CMAKE, "-S", ROOT, "-B", str(build), f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
         "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", *args],
        capture_output=True, text=True, env=env, timeout=120)


def compile_commands(build, *args, **environ):
    """{source path under csrc/: command} after a configuration that must succeed."""
    r = configure(build, *args, **environ)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(os.path.join(build, "compile_commands.json")) as f:
        return {c["file"].replace(os.sep, "/").split("/csrc/", 1)[1]: c["command"] for c in json.load(f)}


def expected_flags(archs):
    """setup.py's -gencode flags for a TORCH_CUDA_ARCH_LIST: its own with a
    9.0 in the list, else torch's cpp_extension's (one per entry, PTX too)."""
    flags = setup.hopper_arch_flags(archs)
    if flags:
        return flags
    for entry in archs.split(";"):
        num = entry.partition("+")[0].replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if entry.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def check(commands, archs):
    """Every .cu gets exactly setup.py's -gencode flags for archs and no
    other architecture flag; CONV2D_EXT_SM90A reaches the .cu and .cpp
    compiles exactly when sm_90a code is built."""
    want = expected_flags(archs)
    sm90a = "-gencode=arch=compute_90a,code=sm_90a" in want
    cuda = {f: c for f, c in commands.items() if f.endswith(".cu")}
    cxx = {f: c for f, c in commands.items() if f.endswith(".cpp")}
    assert "cuda/launch_cache.cu" in cuda and "plan.cpp" in cxx
    assert "python_module.cpp" not in cxx
    for f, command in cuda.items():
        tokens = command.split()
        assert [t for t in tokens if "-gencode" in t or "arch=" in t] == want, f
        assert not re.search(r"--generate-code|-arch[= ]|code=sm_90(?!a)", command), f
        assert ("-DCONV2D_EXT_SM90A" in tokens) == sm90a, f
        assert "-std=c++20" in tokens and "-lineinfo" in tokens, f
    for f, command in cxx.items():
        assert ("-DCONV2D_EXT_SM90A" in command.split()) == sm90a, f


def test_default_list(tmp_path):
    """Without a list: the visible GPUs', else 8.0 and 9.0+PTX, as setup.py."""
    nvcc = os.path.join(TOOLKIT, "bin", "nvcc")
    capabilities = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    archs, _ = setup.resolve_archs({}, setup.nvcc_archs(nvcc), capabilities)
    check(compile_commands(tmp_path), archs)


def test_default_without_gpu_is_sm80_sm90a_compute90(tmp_path):
    check(compile_commands(tmp_path, "-DTORCH_CUDA_ARCH_LIST=8.0;9.0+PTX"), "8.0;9.0+PTX")
    assert setup.hopper_arch_flags("8.0;9.0+PTX") == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_90,code=compute_90",
    ]


def test_hopper_from_the_environment_then_ampere_on_reconfiguring(tmp_path):
    # The environment's list, as torch's CMake and setup.py read it; "Hopper"
    # is 9.0+PTX. Configured again for 8.0, the define goes.
    check(compile_commands(tmp_path, TORCH_CUDA_ARCH_LIST="Hopper"), "9.0+PTX")
    check(compile_commands(tmp_path, "-DTORCH_CUDA_ARCH_LIST=8.0"), "8.0")


def test_cmake_cuda_architectures_is_refused(tmp_path):
    r = configure(tmp_path, "-DCMAKE_CUDA_ARCHITECTURES=90")
    assert r.returncode != 0
    assert "TORCH_CUDA_ARCH_LIST" in r.stderr and "ignored" in r.stderr
