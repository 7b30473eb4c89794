"""Fails if the extension in a wheel needs a shared library that neither
torch nor the base system provides (auditwheel would otherwise vendor it).

    python scripts/check_wheel_deps.py dist/conv2d_ext-*.whl
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

wheel = sys.argv[1]
with tempfile.TemporaryDirectory() as tmp:
    with zipfile.ZipFile(wheel) as zf:
        modules = [n for n in zf.namelist() if n.endswith(".so")]
        zf.extractall(tmp, modules)
    assert modules, f"no extension module in {wheel}"
    bad = []
    for module in modules:
        out = subprocess.run(["readelf", "-d", os.path.join(tmp, module)], capture_output=True, text=True,
                             check=True).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
        print(f"{module}: needs {', '.join(needed)}")
        bad += [lib for lib in needed if not ALLOWED.match(lib)]
        if not any(lib.startswith("libstdc++") for lib in needed):
            bad.append("(libstdc++ linked statically: a second C++ runtime in the process)")
sys.exit(f"unexpected dependencies: {bad}" if bad else 0)
