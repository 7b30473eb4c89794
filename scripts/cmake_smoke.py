"""Loads the CMake-built library (no Python package involved) and checks the
three ops against PyTorch on the CPU.

    python scripts/cmake_smoke.py path/to/libconv2d_ext.so
"""
import sys

import torch
import torch.nn.functional as F

torch.ops.load_library(sys.argv[1])
ops = torch.ops.conv2d_ext
torch.manual_seed(0)
x = torch.randn(2, 4, 11, 13, dtype=torch.float64, requires_grad=True)
w = torch.randn(6, 2, 3, 5, dtype=torch.float64, requires_grad=True)
geometry = ([2, 1], [1, 2], [1, 2], 2)
y_ref = F.conv2d(x, w, None, *geometry)
gy = torch.randn_like(y_ref)
gx_ref, gw_ref = torch.autograd.grad(y_ref, [x, w], gy)
results = {
    "forward": (ops.conv2d(x, w, None, *geometry), y_ref),
    "backward_input": (ops.conv2d_backward_input(gy, w, list(x.shape), *geometry), gx_ref),
    "backward_weight": (ops.conv2d_backward_weight(gy, x, list(w.shape), *geometry), gw_ref),
}
for name, (got, want) in results.items():
    err = ((got - want).norm() / want.norm()).item()
    assert err < 1e-12, f"{name}: relative error {err}"
    print(f"cmake library {name}: relative error {err:.1e}")
