"""Benchmark conv2d_ext against PyTorch at its best (cuDNN, benchmark=True).

    python -m conv2d_ext.benchmark [--suite seeds,layers,resnet50 | --shapes a,b]
                                   [--passes forward,...] [--precision tf32,ieee,bf16,fp16]
                                   [--layout nchw,channels_last] [--quick]
                                   [--timing gpu|call] [--json PATH]
    python -m conv2d_ext.benchmark --models [--model resnet50,...] [--precision ...] [--json PATH]
    python -m conv2d_ext.benchmark --report RESULTS.json [--models-json MODELS.json]

Layers: times forward, backward_input (dgrad), backward_weight (wgrad) and
a training step (forward + both gradients of conv2d_ext.Conv2d against
nn.Conv2d) of both implementations side by side in one process, with input
and weight in NCHW and in channels_last. Each record is one layout; the
summary of a (shape, pass, precision) compares the best layout of each side
("best vs best": PyTorch's faster layout against conv2d_ext's faster one).
CUDA events, warm-up, then the median of repeats, over rotating input sets
so that the working set exceeds the L2 cache. By default each sample is the
GPU's time of one call: a spin kernel holds the GPU while the host enqueues
it, so the host's dispatch is not counted (--timing call counts it). Every
result is checked against a float64 reference. Without a GPU it runs the
CPU path on reduced sizes.

Models (--models, needs torchvision): one training step (forward, loss,
backward) of whole torchvision networks, the original against the same
network after conv2d_ext.convert(), in both layouts and precisions: ms per
step (steps back to back, the host's work included where the GPU waits for
it) and peak memory.

Precisions: tf32 and ieee are float32 in PyTorch's two convolution modes
(the default pair); bf16 and fp16 run the layers on 16-bit operands (the
reference in float64 on the same 16-bit values) and the models under
torch.autocast in that dtype.

Memory-bound shapes (depthwise and few-input-channel layers) are judged by
bandwidth rather than FLOP/s: their records also give the achieved GB/s of
the fewest bytes the pass must move (min_bytes) and its fraction of the
GB/s of a plain copy on the same device, measured once in the same run.
"""
import argparse
import copy
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import conv2d_ext


@dataclass(frozen=True)
class Shape:
    n: int
    cin: int
    cout: int
    h: int
    w: int
    kernel: tuple
    stride: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1

    def geometry(self):
        return list(self.stride), list(self.padding), list(self.dilation), self.groups

    def out_hw(self):
        return tuple(
            (i + 2 * p - d * (k - 1) - 1) // s + 1
            for i, k, s, p, d in zip((self.h, self.w), self.kernel, self.stride, self.padding, self.dilation)
        )

    def flops(self):
        """Multiply-adds x 2 of one pass (the same for all three; a step is
        all three)."""
        ho, wo = self.out_hw()
        return 2 * self.n * self.cout * ho * wo * (self.cin // self.groups) * self.kernel[0] * self.kernel[1]

    def reduced(self):
        """A CPU-sized version: batch 1, a quarter of each spatial extent."""
        def shrink(size, k, d, p):
            return max(size // 4, d * (k - 1) + 1 - 2 * p)
        return Shape(1, self.cin, self.cout, shrink(self.h, self.kernel[0], self.dilation[0], self.padding[0]),
                     shrink(self.w, self.kernel[1], self.dilation[1], self.padding[1]),
                     self.kernel, self.stride, self.padding, self.dilation, self.groups)


def resnet50_convolutions(batch=32, size=224):
    """Every distinct convolution of torchvision's ResNet-50 (stride in the
    3x3 of each stage's first block), named r50_<cin>_<cout>_<hw>_k<k>s<s>,
    with how often each occurs in the network."""
    shapes, counts = {}, {}

    def add(cin, cout, hw, k, s):
        name = f"r50_{cin}_{cout}_{hw}_k{k}s{s}"
        shapes[name] = Shape(batch, cin, cout, hw, hw, (k, k), (s, s), (k // 2, k // 2))
        counts[name] = counts.get(name, 0) + 1

    add(3, 64, size, 7, 2)
    cin, hw = 64, size // 4  # after the stem and the max pool
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for block in range(blocks):
            s = stride if block == 0 else 1
            add(cin, width, hw, 1, 1)
            add(width, width, hw, 3, s)
            add(width, 4 * width, hw // s, 1, 1)
            if block == 0:
                add(cin, 4 * width, hw, 1, s)  # the projection shortcut
            cin, hw = 4 * width, hw // s
    return shapes, counts


RESNET50, RESNET50_COUNTS = resnet50_convolutions()

# The benchmark's groups of layers: the workloads conv2d_ext was first built
# for, common CNN layers, and every convolution of ResNet-50.
GROUPS = {
    "seeds": {
        "a": Shape(8, 32, 64, 512, 512, (5, 9)),
        "b": Shape(8, 32, 64, 512, 512, (5, 9), padding=(2, 4), dilation=(2, 3)),
        "c": Shape(8, 64, 128, 512, 1024, (3, 3), padding=(1, 1)),
    },
    "layers": {
        "resnet_3x3": Shape(64, 64, 64, 56, 56, (3, 3), padding=(1, 1)),
        "resnet_1x1": Shape(64, 256, 64, 56, 56, (1, 1)),
        "resnet_down": Shape(64, 128, 256, 56, 56, (3, 3), stride=(2, 2), padding=(1, 1)),
        "stem_7x7": Shape(32, 3, 64, 224, 224, (7, 7), stride=(2, 2), padding=(3, 3)),
        "depthwise_3x3": Shape(32, 128, 128, 112, 112, (3, 3), padding=(1, 1), groups=128),
        "grouped_3x3": Shape(32, 128, 128, 56, 56, (3, 3), padding=(1, 1), groups=32),
        # 8 channels a group (ResNeXt's and RegNet's wider groups).
        "grouped_8_3x3": Shape(32, 256, 256, 56, 56, (3, 3), padding=(1, 1), groups=32),
        "dw_3x3": Shape(16, 64, 64, 512, 512, (3, 3), padding=(1, 1), groups=64),
        "dw_5x5": Shape(32, 256, 256, 56, 56, (5, 5), padding=(2, 2), groups=256),
        "rgb_3x5": Shape(16, 3, 64, 256, 256, (3, 5), padding=(1, 2)),
    },
    "resnet50": RESNET50,
}
SUITE = {name: shape for group in GROUPS.values() for name, shape in group.items()}
GROUP_OF = {name: group for group, shapes in GROUPS.items() for name in shapes}


# Depthwise and few-input-channel layers do a handful of multiply-adds per
# byte, so their ceiling is memory bandwidth, not FLOP/s: for these the
# records also report GB/s against a plain copy.
MEMORY_BOUND = {"dw_3x3", "dw_5x5", "stem_7x7", "rgb_3x5", "depthwise_3x3", "r50_3_64_224_k7s2"}
PASSES = ["forward", "backward_input", "backward_weight", "step"]
PRECISIONS = ["tf32", "ieee"]  # the default
HALF_PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _dtype(precision):
    return HALF_PRECISIONS.get(precision, torch.float32)
LAYOUTS = ["nchw", "channels_last"]
# torchvision models and the batch each one trains with in --models.
MODELS = {"resnet18": 64, "resnet50": 32, "mobilenet_v3_large": 64, "convnext_tiny": 32}


def _step_fn(conv):
    """A training step of one layer: forward, then the input and weight
    gradients. Returns all three, so each can be checked."""
    def fn(x, w, gy):
        x = x.detach().requires_grad_()
        conv.weight.data = w  # the input set's weights, without a copy
        y = conv(x)
        gx, gw = torch.autograd.grad(y, (x, conv.weight), gy)
        return y, gx, gw
    return fn


def _module(cls, shape, device):
    return cls(shape.cin, shape.cout, shape.kernel, shape.stride, shape.padding, shape.dilation,
               shape.groups, bias=False, device=device)


def _ext_fn(pass_, shape, device="cpu"):
    ops = torch.ops.conv2d_ext
    geo = shape.geometry()
    if pass_ == "step":
        return _step_fn(_module(conv2d_ext.Conv2d, shape, device))
    if pass_ == "forward":
        return lambda x, w, gy: ops.conv2d(x, w, None, *geo)
    if pass_ == "backward_input":
        return lambda x, w, gy: ops.conv2d_backward_input(gy, w, list(x.shape), *geo)
    return lambda x, w, gy: ops.conv2d_backward_weight(gy, x, list(w.shape), *geo)


def _torch_fn(pass_, shape, device="cpu"):
    stride, padding, dilation, groups = shape.geometry()
    if pass_ == "step":
        return _step_fn(_module(torch.nn.Conv2d, shape, device))
    if pass_ == "forward":
        return lambda x, w, gy: F.conv2d(x, w, None, stride, padding, dilation, groups)
    mask = [pass_ == "backward_input", pass_ == "backward_weight", False]
    index = 0 if pass_ == "backward_input" else 1

    def fn(x, w, gy):
        grads = torch.ops.aten.convolution_backward(
            gy, x, w, None, stride, padding, dilation, False, [0, 0], groups, mask)
        return grads[index]
    return fn


def _algorithm(pass_, shape, x, w):
    """The algorithm conv2d_ext's plan picks for these operands now (the
    three of a step joined by '/')."""
    if pass_ == "step":
        return "/".join(_algorithm(p, shape, x, w) for p in PASSES[:3])
    return torch.ops.conv2d_ext._algorithm(pass_, x, w, *shape.geometry())


def _make_inputs(shape, device, dtype=torch.float32, generator=None):
    x = torch.randn(shape.n, shape.cin, shape.h, shape.w, device=device, dtype=dtype, generator=generator)
    w = torch.randn(shape.cout, shape.cin // shape.groups, *shape.kernel, device=device, dtype=dtype,
                    generator=generator)
    # Scale so outputs stay O(1) whatever the reduction length.
    w /= math.sqrt(w[0].numel())
    gy = torch.randn(shape.n, shape.cout, *shape.out_hw(), device=device, dtype=dtype, generator=generator)
    return x, w, gy


def _in_layout(tensors, layout):
    """The same values in the given memory format (the one copy happens
    here, outside the timed calls)."""
    if layout == "nchw":
        return tuple(t.contiguous() for t in tensors)
    return tuple(t.contiguous(memory_format=torch.channels_last) for t in tensors)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_SPIN_CYCLES_PER_MS = {}


def _spin_cycles_per_ms(device):
    """Clock cycles of torch.cuda._sleep per millisecond on this device,
    measured once."""
    if device not in _SPIN_CYCLES_PER_MS:
        cycles = 1 << 20
        torch.cuda._sleep(cycles)  # first launch out of the way
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SPIN_CYCLES_PER_MS[device] = cycles / start.elapsed_time(end)
    return _SPIN_CYCLES_PER_MS[device]


def time_ms(fn, input_sets, device, warmup, repeats, budget_s, timing="gpu"):
    """Median milliseconds of fn over rotating input sets.

    timing="gpu" (the default) times the GPU's work only: a spin kernel
    holds the GPU while the host enqueues the start event, the call and the
    end event, so the call's kernels run back to back from the start event
    on, whatever the host's dispatch costs (as nvbench does with its
    blocking kernel). The spin outlasts the host's enqueueing by a factor of
    two or more; if a call took longer to enqueue, the spin is lengthened
    and the sample taken again. timing="call" records the start event
    right before the call on an idle GPU, so the host's dispatch and the
    launch latency are part of every sample."""
    for i in range(warmup):
        fn(*input_sets[i % len(input_sets)])
    _sync(device)
    hold_ms = 0.25
    retries = 0  # a call that blocks the host would lengthen the spin forever
    times = []
    start_wall = time.perf_counter()
    i = 0
    while len(times) < repeats:
        args = input_sets[i % len(input_sets)]
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if timing == "gpu":
                torch.cuda._sleep(int(hold_ms * _spin_cycles_per_ms(device)))
            t0 = time.perf_counter()
            start.record()
            fn(*args)
            end.record()
            host_ms = (time.perf_counter() - t0) * 1e3
            end.synchronize()
            if timing == "gpu" and 2 * host_ms > hold_ms and retries < 5:
                hold_ms = 4 * host_ms  # the GPU may have waited for the host: sample again
                retries += 1
                continue
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - t0) * 1e3)
        i += 1
        if i >= 3 and time.perf_counter() - start_wall > budget_s:
            break
    return statistics.median(times)


def min_bytes(shape, pass_, elem_bytes=4):
    """The fewest bytes a pass must move (elements of elem_bytes): each
    input read once, the output written once. forward: x + w + y; backward_input:
    grad_output + w + grad_input; backward_weight: grad_output + x +
    grad_weight; a step runs all three passes, so it is their sum."""
    x = shape.n * shape.cin * shape.h * shape.w
    w = shape.cout * (shape.cin // shape.groups) * shape.kernel[0] * shape.kernel[1]
    y = shape.n * shape.cout * math.prod(shape.out_hw())
    elements = {"forward": x + w + y, "backward_input": y + w + x, "backward_weight": y + x + w}
    elements["step"] = sum(elements.values())
    return elem_bytes * elements[pass_]


def copy_gbps(device, warmup, repeats, budget_s, timing="gpu"):
    """GB/s of dst.copy_(src), counting bytes read plus bytes written: the
    practical bandwidth ceiling a memory-bound pass is measured against. On
    a GPU the tensor is at least 4x the L2 cache, so the copy streams from
    and to device memory."""
    if device.type == "cuda":
        nbytes = max(4 * torch.cuda.get_device_properties(device).L2_cache_size, 256 << 20)
    else:
        nbytes = 64 << 20
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda s, d: d.copy_(s), [(src, dst)], device, warmup, repeats, budget_s, timing)
    return 2 * src.numel() * 4 / ms / 1e6


def rel_err(out, ref):
    """Relative L2 error; for a step (several results), the worst of them."""
    if isinstance(out, tuple):
        return max(rel_err(o, r) for o, r in zip(out, ref))
    out = out.double()
    return ((out - ref).norm() / ref.norm()).item()


def _cudnn(precision):
    """cuDNN as the comparison runs it: enabled, autotuned, and in the given
    precision mode (which conv2d_ext follows too; 16-bit runs keep the
    default, TF32)."""
    return torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False,
                                      allow_tf32=precision != "ieee")


def _reference(pass_, shape, x, w, gy):
    """The pass in float64 (cuDNN's strict mode on a GPU)."""
    with _cudnn("ieee"):
        if pass_ == "step":  # through the functional path
            x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
            y64 = F.conv2d(x64, w64, None, *shape.geometry())
            return (y64.detach(), *torch.autograd.grad(y64, (x64, w64), gy.double()))
        return _torch_fn(pass_, shape)(x.double(), w.double(), gy.double())


def run(shapes, passes, precisions, device, quick=False, progress=print, timing="gpu", layouts=LAYOUTS):
    """One record per (shape, pass, precision, layout)."""
    records = []
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 32 << 20
    warmup, repeats, budget = (1, 5, 0.3) if quick else (3, 30, 1.5)
    total = len(shapes) * len(passes) * len(precisions) * len(layouts)
    done = 0
    copy_rate = None  # copy GB/s: measured once, and only if a memory-bound shape runs
    for name in shapes:
        shape = SUITE[name] if device.type == "cuda" else SUITE[name].reduced()
        elem_bytes = min(torch.finfo(_dtype(p)).bits // 8 for p in precisions)
        set_bytes = sum(t.numel() * elem_bytes for t in _make_inputs(shape, "meta"))
        n_sets = max(1, min(4, math.ceil(2 * l2 / set_bytes)))
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()))
        nchw_sets = [_make_inputs(shape, device, generator=gen) for _ in range(n_sets)]
        if name in MEMORY_BOUND and copy_rate is None:
            copy_rate = copy_gbps(device, warmup, repeats, budget, timing)
            progress(f"copy: {copy_rate:.1f} GB/s")
        for pass_ in passes:
            ext, ref_fn = _ext_fn(pass_, shape, device), _torch_fn(pass_, shape, device)
            # float64 on the values each precision's operands hold.
            references = {}
            for dtype in {_dtype(p) for p in precisions}:
                references[dtype] = _reference(pass_, shape, *(t.to(dtype) for t in nchw_sets[0]))
            for layout in layouts:
                sets32 = [_in_layout(s, layout) for s in nchw_sets] if layout != "nchw" else nchw_sets
                for precision in precisions:
                    dtype = _dtype(precision)
                    sets = sets32 if dtype == torch.float32 else \
                        [tuple(t.to(dtype) for t in s) for s in sets32]
                    x, w, gy = sets[0]
                    reference = references[dtype]
                    with _cudnn(precision):
                        ext_err = rel_err(ext(x, w, gy), reference)
                        torch_err = rel_err(ref_fn(x, w, gy), reference)
                        ext_ms = time_ms(ext, sets, device, warmup, repeats, budget, timing)
                        torch_ms = time_ms(ref_fn, sets, device, warmup, repeats, budget, timing)
                        algo = _algorithm(pass_, shape, x, w)
                    flops = shape.flops() * (3 if pass_ == "step" else 1)
                    rec = {
                        "shape": name,
                        "group": GROUP_OF[name],
                        "pass": pass_,
                        "precision": precision,
                        "layout": layout,
                        "ext_ms": ext_ms,
                        "torch_ms": torch_ms,
                        "speedup": torch_ms / ext_ms,
                        "ext_tflops": flops / ext_ms / 1e9,
                        "torch_tflops": flops / torch_ms / 1e9,
                        "ext_rel_err": ext_err,
                        "torch_rel_err": torch_err,
                        "algo": algo,
                        "config": asdict(shape),
                    }
                    if name in MEMORY_BOUND:
                        nbytes = min_bytes(shape, pass_, torch.finfo(dtype).bits // 8)
                        rec["min_bytes"] = nbytes
                        rec["ext_gbps"] = nbytes / ext_ms / 1e6
                        rec["torch_gbps"] = nbytes / torch_ms / 1e6
                        rec["copy_gbps"] = copy_rate
                        rec["copy_fraction"] = rec["ext_gbps"] / copy_rate
                    records.append(rec)
                    done += 1
                    progress(f"[{done}/{total}] {name} {pass_} {precision} {layout} ({algo}): "
                             f"ext {ext_ms:.3f} ms, torch {torch_ms:.3f} ms, speedup {rec['speedup']:.2f}x, "
                             f"err {ext_err:.2e} vs {torch_err:.2e}")
                    del sets
                del sets32
            del references
        del nchw_sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return records


# Fields of a record that belong to one side's layout in a summary.
_EXT_FIELDS = ("ext_ms", "ext_tflops", "ext_rel_err", "algo", "ext_gbps", "copy_fraction")
_TORCH_FIELDS = ("torch_ms", "torch_tflops", "torch_rel_err", "torch_gbps")


def _fastest(records):
    """Each side's fastest record among one case's layouts."""
    return min(records, key=lambda r: r["ext_ms"]), min(records, key=lambda r: r["torch_ms"])


def summarize(records):
    """Best vs best: for each (shape, pass, precision), PyTorch's fastest
    layout against conv2d_ext's fastest; then, per (pass, precision), the
    sums over ResNet-50's distinct convolutions (r50_total) and over the
    network, each weighted by how often it occurs (r50_network)."""
    cases = {}
    for r in records:
        r = dict(r, layout=r.get("layout", "nchw"))  # files from before layouts
        cases.setdefault((r["shape"], r["pass"], r["precision"]), []).append(r)
    summary = []
    for (shape, pass_, precision), recs in cases.items():
        ext, ref = _fastest(recs)
        s = {"shape": shape, "group": ext.get("group", GROUP_OF.get(shape)), "pass": pass_,
             "precision": precision, "ext_layout": ext["layout"], "torch_layout": ref["layout"]}
        s.update({k: ext[k] for k in _EXT_FIELDS if k in ext})
        s.update({k: ref[k] for k in _TORCH_FIELDS if k in ref})
        s["speedup"] = ref["torch_ms"] / ext["ext_ms"]
        for k in ("min_bytes", "copy_gbps"):
            if k in ext:
                s[k] = ext[k]
        summary.append(s)
    totals = []
    for name, weight in (("r50_total", lambda s: 1), ("r50_network", lambda s: RESNET50_COUNTS[s])):
        by_case = {}
        for s in summary:
            if s["shape"] in RESNET50:
                by_case.setdefault((s["pass"], s["precision"]), []).append(s)
        for (pass_, precision), rows in by_case.items():
            if len(rows) < len(RESNET50):
                continue  # a partial set sums to nothing meaningful
            ext_ms = sum(weight(r["shape"]) * r["ext_ms"] for r in rows)
            torch_ms = sum(weight(r["shape"]) * r["torch_ms"] for r in rows)
            worst = min(rows, key=lambda r: r["speedup"])
            totals.append({"shape": name, "group": "resnet50", "pass": pass_, "precision": precision,
                           "ext_ms": ext_ms, "torch_ms": torch_ms, "speedup": torch_ms / ext_ms,
                           "worst_shape": worst["shape"], "worst_speedup": worst["speedup"]})
    return summary + totals


def _table(header, rows):
    rows = [tuple(header)] + [tuple(r) for r in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(wd) for c, wd in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (wd + 2) for wd in widths) + "|")
    return "\n".join(lines)


_SHORT = {"nchw": "nchw", "channels_last": "cl"}


def format_table(records):
    """One row per record (one layout each)."""
    header = ("shape", "pass", "prec", "layout", "algo", "ext ms", "torch ms", "ext TF/s", "torch TF/s",
              "ext GB/s", "copy %", "speedup", "ext err", "torch err")
    rows = []
    for r in records:
        rows.append((r["shape"], r["pass"], r["precision"], _SHORT[r.get("layout", "nchw")], r.get("algo", "-"),
                     f"{r['ext_ms']:.3f}", f"{r['torch_ms']:.3f}", f"{r['ext_tflops']:.2f}",
                     f"{r['torch_tflops']:.2f}", _gbps(r), _copy(r), f"{r['speedup']:.2f}x",
                     f"{r['ext_rel_err']:.1e}", f"{r['torch_rel_err']:.1e}"))
    return _table(header, rows)


def _gbps(r):
    return f"{r['ext_gbps']:.1f}" if "ext_gbps" in r else "-"


def _copy(r):
    return f"{100 * r['copy_fraction']:.0f}%" if "copy_fraction" in r else "-"


def format_summary(summary):
    """Best vs best, one row per (shape, pass, precision): each side's time
    in its faster layout, and which layout that was."""
    header = ("shape", "pass", "prec", "ext ms", "ext layout", "torch ms", "torch layout", "speedup",
              "ext TF/s", "ext GB/s", "copy %", "ext err", "torch err", "algo")
    rows = []
    for s in summary:
        if s["shape"] in ("r50_total", "r50_network"):
            continue
        rows.append((s["shape"], s["pass"], s["precision"], f"{s['ext_ms']:.3f}", _SHORT[s["ext_layout"]],
                     f"{s['torch_ms']:.3f}", _SHORT[s["torch_layout"]], f"{s['speedup']:.2f}x",
                     f"{s['ext_tflops']:.2f}", _gbps(s), _copy(s), f"{s['ext_rel_err']:.1e}",
                     f"{s['torch_rel_err']:.1e}", s.get("algo", "-")))
    return _table(header, rows)


def format_totals(summary):
    rows = [(s["shape"], s["pass"], s["precision"], f"{s['ext_ms']:.3f}", f"{s['torch_ms']:.3f}",
             f"{s['speedup']:.2f}x", s["worst_shape"], f"{s['worst_speedup']:.2f}x")
            for s in summary if s["shape"] in ("r50_total", "r50_network")]
    header = ("set", "pass", "prec", "ext ms", "torch ms", "speedup", "worst layer", "its speedup")
    return _table(header, rows) if rows else ""


def format_models(records):
    header = ("model", "batch", "prec", "layout", "ext ms", "torch ms", "speedup", "ext peak GiB",
              "torch peak GiB", "loss diff")
    rows = [(r["model"], str(r["batch"]), r["precision"], _SHORT[r["layout"]], f"{r['ext_ms']:.2f}",
             f"{r['torch_ms']:.2f}", f"{r['speedup']:.2f}x", f"{r['ext_peak_gib']:.2f}",
             f"{r['torch_peak_gib']:.2f}", f"{r['loss_rel_diff']:.1e}") for r in records]
    return _table(header, rows)


def summarize_models(records):
    """Best vs best per (model, precision), and the converted model against
    the original in the same layout (a converted NCHW model must not be
    slower than the NCHW original)."""
    cases = {}
    for r in records:
        cases.setdefault((r["model"], r["precision"]), []).append(r)
    out = []
    for (model, precision), recs in cases.items():
        ext, ref = _fastest(recs)
        out.append({"model": model, "batch": ext["batch"], "precision": precision,
                    "ext_ms": ext["ext_ms"], "ext_layout": ext["layout"],
                    "torch_ms": ref["torch_ms"], "torch_layout": ref["layout"],
                    "speedup": ref["torch_ms"] / ext["ext_ms"]})
    return out


def format_models_summary(summary):
    header = ("model", "prec", "ext ms", "ext layout", "torch ms", "torch layout", "speedup")
    rows = [(s["model"], s["precision"], f"{s['ext_ms']:.2f}", _SHORT[s["ext_layout"]], f"{s['torch_ms']:.2f}",
             _SHORT[s["torch_layout"]], f"{s['speedup']:.2f}x") for s in summary]
    return _table(header, rows)


def _torchvision_models():
    try:
        import torchvision
    except ImportError:
        raise SystemExit("--models needs torchvision: pip install torchvision (the version that matches "
                         f"torch {torch.__version__.split('+')[0]}), or pip install 'conv2d_ext[benchmark]'")
    return {name: (lambda name=name: getattr(torchvision.models, name)(weights=None)) for name in MODELS}


def _model_step(model, x, target, autocast=None):
    """A training step; with `autocast` (a 16-bit dtype), its forward under
    torch.autocast in that dtype."""
    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
            loss = F.cross_entropy(model(x), target)
        loss.backward()
        return loss
    return step


def _time_steps(step, device, warmup, rounds, steps):
    """ms per training step: steps back to back, so that the host's work
    overlaps the GPU's as in a training loop; the median over rounds."""
    for _ in range(warmup):
        step()
    _sync(device)
    times = []
    for _ in range(rounds):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / steps)
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            times.append((time.perf_counter() - t0) * 1e3 / steps)
    return statistics.median(times)


def _peak_gib(step, device):
    """Device memory one step allocates at its peak beyond what was
    allocated before it (the models' parameters and the inputs)."""
    if device.type != "cuda":
        return 0.0
    _sync(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**30


def run_models(builders, precisions, device, quick=False, progress=print, layouts=LAYOUTS, batches=None,
               size=224, classes=1000):
    """A training step (forward, cross-entropy loss, backward) of each model
    as built (PyTorch's convolutions) against a copy after convert(), with
    the same weights and inputs, in each layout and precision."""
    warmup, rounds, steps = (1, 1, 2) if quick else (3, 5, 5)
    records = []
    for name, build in builders.items():
        batch = (batches or MODELS).get(name, 8)
        if device.type != "cuda":
            batch = min(batch, 2)
        torch.manual_seed(zlib.crc32(name.encode()))
        original = build().to(device)
        converted = conv2d_ext.convert(copy.deepcopy(original))
        x = torch.randn(batch, 3, size, size, device=device)
        target = torch.randint(0, classes, (batch,), device=device)
        for layout in layouts:
            fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            original.to(memory_format=fmt)
            converted.to(memory_format=fmt)
            xl = x.contiguous(memory_format=fmt)
            for precision in precisions:
                with _cudnn(precision):
                    autocast = HALF_PRECISIONS.get(precision)
                    ext_step, torch_step = (_model_step(m, xl, target, autocast) for m in (converted, original))
                    ext_loss, torch_loss = ext_step().item(), torch_step().item()
                    ext_ms = _time_steps(ext_step, device, warmup, rounds, steps)
                    torch_ms = _time_steps(torch_step, device, warmup, rounds, steps)
                    peaks = []
                    for step in (ext_step, torch_step):
                        original.zero_grad(set_to_none=True)
                        converted.zero_grad(set_to_none=True)
                        peaks.append(_peak_gib(step, device))
                    ext_peak, torch_peak = peaks
                rec = {"model": name, "batch": batch, "precision": precision, "layout": layout,
                       "ext_ms": ext_ms, "torch_ms": torch_ms, "speedup": torch_ms / ext_ms,
                       "ext_peak_gib": ext_peak, "torch_peak_gib": torch_peak,
                       "ext_loss": ext_loss, "torch_loss": torch_loss,
                       "loss_rel_diff": abs(ext_loss - torch_loss) / abs(torch_loss)}
                records.append(rec)
                progress(f"{name} b{batch} {precision} {layout}: ext {ext_ms:.2f} ms ({ext_peak:.2f} GiB), "
                         f"torch {torch_ms:.2f} ms ({torch_peak:.2f} GiB), speedup {rec['speedup']:.2f}x, "
                         f"losses {ext_loss:.6f} / {torch_loss:.6f}")
        original.zero_grad(set_to_none=True)
        converted.zero_grad(set_to_none=True)
        del original, converted, x, target
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return records


def environment(device):
    cuda = device.type == "cuda"
    env = {
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu ({platform.machine()})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None,
        "threads": None if cuda else torch.get_num_threads(),
        "conv2d_ext": conv2d_ext.__version__,
        "build": conv2d_ext.build_info(),
        "commit": os.environ.get("CONV2D_EXT_COMMIT"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return env


def _header(env):
    if env["cuda"] is None:
        return f"# {env['device']}, {env['threads']} threads, torch {env['torch']}"
    return f"# {env['device']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}"


def report(results, models=None):
    """The markdown report of a results file (and a models file): best vs
    best per group, the ResNet-50 totals, the models, then every record."""
    parts = [_header(results) + f" (commit {results.get('commit')}, {results.get('date')})", "",
             headline(results, models), ""]
    summary = results.get("summary") or summarize(results["records"])
    for group in GROUPS:
        rows = [s for s in summary if s.get("group") == group and s["shape"] not in ("r50_total", "r50_network")]
        if rows:
            parts += [f"## {group}: best vs best", "", format_summary(rows), ""]
    totals = format_totals(summary)
    if totals:
        parts += ["## ResNet-50: sums of best times over its distinct convolutions (r50_total) and over "
                  "the network, each as often as it occurs (r50_network); each layer in its side's faster "
                  "layout, which a whole network, in one layout, cannot pick layer by layer (--models times that)",
                  "", totals, ""]
    if models:
        parts += [f"## Models: one training step ({_header(models)[2:]}, commit {models.get('commit')})", "",
                  format_models_summary(models.get("summary") or summarize_models(models["records"])), "",
                  format_models(models["records"]), ""]
    parts += ["## Every record (one layout each)", "", format_table(results["records"]), ""]
    return "\n".join(parts)


_PASS_SHORT = {"forward": "fwd", "backward_input": "dgrad", "backward_weight": "wgrad", "step": "step"}


def _range(rows):
    """'lo-hi x (worst: shape pass)' of best-vs-best speedups."""
    if not rows:
        return "-"
    lo, hi = min(rows, key=lambda s: s["speedup"]), max(rows, key=lambda s: s["speedup"])
    worst = f"{lo['shape']} {_PASS_SHORT.get(lo['pass'], lo['pass'])}" if "pass" in lo else lo.get("model", "")
    return f"{lo['speedup']:.2f}-{hi['speedup']:.2f}x (lowest: {worst})"


def headline(results, models=None):
    """The README's short table: best-vs-best speedups per group and
    precision, the lowest named."""
    summary = results.get("summary") or summarize(results["records"])
    layers = [s for s in summary if s["shape"] not in ("r50_total", "r50_network")]
    passes3 = PASSES[:3]

    def pick(precision, names, passes):
        return [s for s in layers if s["precision"] == precision and s["shape"] in names and s["pass"] in passes]

    def r50_sum(precision):
        rows = [s for s in summary if s["shape"] == "r50_total" and s["precision"] == precision
                and s["pass"] in passes3]
        if len(rows) < 3:
            return "-"
        ext, ref = sum(s["ext_ms"] for s in rows), sum(s["torch_ms"] for s in rows)
        return f"{ref / ext:.2f}x ({ext:.1f} ms against {ref:.1f} ms)"

    other = [n for n in GROUPS["layers"] if n not in MEMORY_BOUND]
    bound = [n for n in SUITE if n in MEMORY_BOUND]
    lines = [
        ("seeds a, b, c: fwd, dgrad, wgrad", lambda p: _range(pick(p, GROUPS["seeds"], passes3))),
        ("seeds a, b, c: training step", lambda p: _range(pick(p, GROUPS["seeds"], ["step"]))),
        ("ResNet-50's 23 convolutions: fwd + dgrad + wgrad summed", r50_sum),
        ("ResNet-50's 23 convolutions: each pass", lambda p: _range(pick(p, RESNET50, passes3))),
        ("other CNN layers (" + ", ".join(other) + "): every pass",
         lambda p: _range(pick(p, other, PASSES))),
        ("memory-bound layers (depthwise, RGB stems): every pass", lambda p: _range(pick(p, bound, PASSES))),
    ]
    if models:
        msum = models.get("summary") or summarize_models(models["records"])
        lines.append(("whole models, training step (" + ", ".join(dict.fromkeys(s["model"] for s in msum)) + ")",
                      lambda p: _range([s for s in msum if s["precision"] == p])))
    names = {"tf32": "TF32", "ieee": "IEEE (FP32-accurate)", "bf16": "bfloat16", "fp16": "float16"}
    # float32's two modes always; a 16-bit precision where the records have it.
    present = {s["precision"] for s in summary}
    if models:
        present |= {r["precision"] for r in models.get("summary") or models["records"]}
    precisions = PRECISIONS + [p for p in HALF_PRECISIONS if p in present]
    rows = [(label, *(fn(p) for p in precisions)) for label, fn in lines]
    return _table(("best vs best", *(names[p] for p in precisions)), rows)


def _csv(value, choices, what):
    items = [v for v in value.split(",") if v]
    bad = [v for v in items if v not in choices]
    if bad:
        raise SystemExit(f"unknown {what}: {', '.join(bad)} (choose from {', '.join(choices)})")
    return items


def select_shapes(suite="all", shapes=None):
    """Shape names from --shapes if given, else from the --suite groups."""
    if shapes:
        return _csv(shapes, list(SUITE), "shape")
    groups = list(GROUPS) if suite == "all" else _csv(suite, list(GROUPS), "suite")
    return [name for group in groups for name in GROUPS[group]]


def _epilog():
    lines = ["shapes (--shapes), by group (--suite):"]
    for group, shapes in GROUPS.items():
        lines.append(f"  {group}: {', '.join(shapes)}")
    lines.append(f"models (--model): {', '.join(MODELS)}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m conv2d_ext.benchmark", description=__doc__, epilog=_epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="all",
                        help="groups of shapes: seeds, layers, resnet50, or all (default); comma-separated")
    parser.add_argument("--shapes", help="comma-separated shape names (listed below); overrides --suite")
    parser.add_argument("--passes", default=",".join(PASSES),
                        help="forward, backward_input (dgrad), backward_weight (wgrad) and step (forward "
                             "and both gradients of a Conv2d module); comma-separated, default all")
    parser.add_argument("--precision", default=",".join(PRECISIONS),
                        help="tf32 and ieee (float32's two modes, the default), bf16, fp16; "
                             "a CPU runs ieee (and bf16 if asked)")
    parser.add_argument("--layout", default=",".join(LAYOUTS),
                        help="memory format of the operands: nchw, channels_last or both (default)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--timing", choices=["gpu", "call"], default="gpu",
                        help="gpu: the GPU's time of each call, its host dispatch hidden behind a spin kernel "
                             "(default); call: from an idle GPU, the host's dispatch and launch included")
    parser.add_argument("--models", action="store_true",
                        help="time whole-model training steps instead of layers (needs torchvision)")
    parser.add_argument("--model", default=",".join(MODELS), help="models for --models; comma-separated")
    parser.add_argument("--json", metavar="PATH", help="write the records, summary and environment as JSON")
    parser.add_argument("--resume", action="store_true",
                        help="with --json: keep the shapes (models) that file already holds whole, run the rest")
    parser.add_argument("--report", metavar="RESULTS_JSON",
                        help="print the markdown report of a results file instead of running")
    parser.add_argument("--models-json", metavar="MODELS_JSON", help="with --report: add a --models results file")
    parser.add_argument("--headline", action="store_true",
                        help="with --report: only the short best-vs-best table per group (the README's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where to run: cuda (the default when a GPU is visible), cuda:N, or cpu "
                             "(conv2d_ext's CPU path against PyTorch's, on reduced sizes)")
    args = parser.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            results = json.load(f)
        models = None
        if args.models_json:
            with open(args.models_json) as f:
                models = json.load(f)
        print(headline(results, models) if args.headline else report(results, models))
        return 0
    passes = _csv(args.passes, PASSES, "pass")
    precisions = _csv(args.precision, PRECISIONS + list(HALF_PRECISIONS), "precision")
    layouts = _csv(args.layout, LAYOUTS, "layout")
    shapes = select_shapes(args.suite, args.shapes)
    device = torch.device(args.device)
    if device.type == "cpu":
        precisions = ["ieee"] + [p for p in precisions if p == "bf16"]  # TF32 is a GPU mode
        print("no GPU: timing the CPU path on reduced sizes", file=sys.stderr)
    env = environment(device)
    print(_header(env), file=sys.stderr)
    progress = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    # Each shape (model) is run whole and the file rewritten after it, so a
    # run cut short keeps what it finished, and --resume carries on from it.
    key = "model" if args.models else "shape"
    env["timing"] = "steps back to back" if args.models else args.timing if device.type == "cuda" else "wall"
    records = []
    if args.resume and args.json and os.path.exists(args.json):
        with open(args.json) as f:
            previous = json.load(f)
        for field in ("device", "commit", "timing"):
            if previous.get(field) != env.get(field):
                raise SystemExit(f"--resume: {args.json} has {field} {previous.get(field)!r}, this run "
                                 f"{env.get(field)!r}; remove the file to start again")
        # An item is done when it holds every case this run asks for.
        wanted = {(p, q, layout) for p in ([None] if args.models else passes) for q in precisions
                  for layout in layouts}
        cases = {}
        for r in previous["records"]:
            cases.setdefault(r[key], set()).add((r.get("pass"), r["precision"], r["layout"]))
        done = {item for item, have in cases.items() if have == wanted}
        records = [r for r in previous["records"] if r[key] in done]
        env = {k: v for k, v in previous.items() if k not in ("summary", "records")}
        env["resumed"] = env.get("resumed", 0) + 1
        progress(f"resuming {args.json}: {len(done)} {key}s done")
    else:
        done = set()
    if args.models:
        builders = _torchvision_models()
        items = [n for n in _csv(args.model, list(MODELS), "model") if n not in done]
        summarize_fn = summarize_models

        def run_one(name):
            return run_models({name: builders[name]}, precisions, device, args.quick, progress, layouts)
    else:
        items = [n for n in shapes if n not in done]
        summarize_fn = summarize

        def run_one(name):
            return run([name], passes, precisions, device, args.quick, progress=progress, timing=args.timing,
                       layouts=layouts)
    for item in items:
        records += run_one(item)
        if args.json:  # replaced whole, so a run stopped mid-write leaves the last file intact
            with open(args.json + ".tmp", "w") as f:
                json.dump({**env, "summary": summarize_fn(records), "records": records}, f, indent=1)
            os.replace(args.json + ".tmp", args.json)
    summary = summarize_fn(records)
    if args.models:
        print(format_models_summary(summary))
        print()
        print(format_models(records))
    else:
        print(format_summary(summary))
        totals = format_totals(summary)
        if totals:
            print()
            print(totals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
