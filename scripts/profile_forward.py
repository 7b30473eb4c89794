"""Runs one forward of a benchmark shape, for a profiler to capture.

    ncu -k regex:fprop python scripts/profile_forward.py a tf32
"""
import sys

import torch

import conv2d_ext
from conv2d_ext.benchmark import SUITE, _make_inputs

shape = SUITE[sys.argv[1] if len(sys.argv) > 1 else "a"]
torch.backends.cudnn.allow_tf32 = (sys.argv[2] if len(sys.argv) > 2 else "tf32") == "tf32"
x, w, _ = _make_inputs(shape, "cuda")
for _ in range(2):
    y = conv2d_ext.conv2d(x, w, None, shape.stride, shape.padding, shape.dilation, shape.groups)
torch.cuda.synchronize()
