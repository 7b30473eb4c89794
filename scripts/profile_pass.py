"""Runs one pass of a benchmark shape twice, for a profiler to capture.

    ncu -k regex:dgrad python scripts/profile_pass.py stem_7x7 ieee backward_input \
        [--switch few_channels_dgrad_pairs=0] [--layout channels_last]

The pass is one of conv2d_ext.benchmark.PASSES; --switch sets one of the
op's switches first (csrc/options.h lists them); --layout is one of the
benchmark's layouts.
"""
import argparse

import torch

import conv2d_ext
from conv2d_ext.benchmark import LAYOUTS, PASSES, SUITE, _in_layout, _make_inputs

parser = argparse.ArgumentParser()
parser.add_argument("shape", choices=list(SUITE))
parser.add_argument("precision", choices=["tf32", "ieee"])
parser.add_argument("pass_", choices=[p for p in PASSES if p != "step"])
parser.add_argument("--switch", action="append", default=[], metavar="NAME=0|1")
parser.add_argument("--layout", choices=LAYOUTS, default="nchw")
args = parser.parse_args()
for item in args.switch:
    name, _, value = item.partition("=")
    torch.ops.conv2d_ext._set_option(name, value == "1")

shape = SUITE[args.shape]
torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
x, w, gy = _in_layout(_make_inputs(shape, "cuda"), args.layout)
geometry = (shape.stride, shape.padding, shape.dilation, shape.groups)
for _ in range(2):
    if args.pass_ == "forward":
        conv2d_ext.conv2d(x, w, None, *geometry)
    else:
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = conv2d_ext.conv2d(xg, wg, None, *geometry)
        torch.autograd.grad(y, xg if args.pass_ == "backward_input" else wg, gy)
torch.cuda.synchronize()
