"""Fails if a built extension module needs a shared library that neither
torch nor the base system provides, or carries its own static libstdc++ (a
second C++ runtime in the process: the first error message it formats
crashes). Takes a wheel or the module itself.

    python scripts/check_module_deps.py dist/conv2d_ext-*.whl
    python scripts/check_module_deps.py conv2d_ext/_C.abi3.so
"""
import os
import re
import subprocess
import sys
import tempfile
import zipfile

# Provided by torch (or the CUDA runtime torch ships) or by every Linux.
ALLOWED = re.compile(
    r"^(libtorch\w*|libc10\w*|libcudart|libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux-x86-64)\.so")


def problems(module_path, name):
    out = subprocess.run(["readelf", "-d", module_path], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
    print(f"{name}: needs {', '.join(needed)}")
    bad = [lib for lib in needed if not ALLOWED.match(lib)]
    if not any(lib.startswith("libstdc++") for lib in needed):
        bad.append("(libstdc++ linked statically: set CXX/CC to a compiler that links it dynamically)")
    return bad


def main(path):
    if not path.endswith(".whl"):
        return problems(path, path)
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(path) as zf:
            modules = [n for n in zf.namelist() if n.endswith(".so")]
            zf.extractall(tmp, modules)
        assert modules, f"no extension module in {path}"
        for module in modules:
            bad += problems(os.path.join(tmp, module), module)
    return bad


if __name__ == "__main__":
    bad = main(sys.argv[1])
    sys.exit(f"unusable build: {bad}" if bad else 0)
