"""Benchmark conv2d_ext against PyTorch (cuDNN with benchmark=True).

    python -m conv2d_ext.benchmark [--shapes a,b,c] [--passes forward,...]
                                   [--precision tf32,ieee] [--quick]
                                   [--timing gpu|call] [--json PATH]

Times forward, backward_input (dgrad), backward_weight (wgrad) and a
training step (forward + both gradients of conv2d_ext.Conv2d against
nn.Conv2d) of both implementations side by side in one process, with CUDA
events (warm-up, then the median of repeats), rotating input sets so that
the working set exceeds the L2 cache. By default each sample is the GPU's
time of one call: a spin kernel holds the GPU while the host enqueues it,
so the host's dispatch is not counted (--timing call counts it). Every
result is checked against a float64 reference. Without a GPU it runs the
CPU path on reduced sizes.

Memory-bound shapes (MEMORY_BOUND: depthwise and few-input-channel layers)
are judged by bandwidth rather than FLOP/s: their records also give the
achieved GB/s of the fewest bytes the pass must move (min_bytes) and its
fraction of the GB/s of a plain copy on the same device, measured once in
the same run.
"""
import argparse
import datetime
import json
import math
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


# The workloads conv2d_ext exists for (a, b, c), then common CNN layers.
SUITE = {
    "a": Shape(8, 32, 64, 512, 512, (5, 9)),
    "b": Shape(8, 32, 64, 512, 512, (5, 9), padding=(2, 4), dilation=(2, 3)),
    "c": Shape(8, 64, 128, 512, 1024, (3, 3), padding=(1, 1)),
    "resnet_3x3": Shape(64, 64, 64, 56, 56, (3, 3), padding=(1, 1)),
    "resnet_1x1": Shape(64, 256, 64, 56, 56, (1, 1)),
    "resnet_down": Shape(64, 128, 256, 56, 56, (3, 3), stride=(2, 2), padding=(1, 1)),
    "stem_7x7": Shape(32, 3, 64, 224, 224, (7, 7), stride=(2, 2), padding=(3, 3)),
    "depthwise_3x3": Shape(32, 128, 128, 112, 112, (3, 3), padding=(1, 1), groups=128),
    "grouped_3x3": Shape(32, 128, 128, 56, 56, (3, 3), padding=(1, 1), groups=32),
    "dw_3x3": Shape(16, 64, 64, 512, 512, (3, 3), padding=(1, 1), groups=64),
    "dw_5x5": Shape(32, 256, 256, 56, 56, (5, 5), padding=(2, 2), groups=256),
    "rgb_3x5": Shape(16, 3, 64, 256, 256, (3, 5), padding=(1, 2)),
}
# Depthwise and few-input-channel layers do a handful of multiply-adds per
# byte, so their ceiling is memory bandwidth, not FLOP/s: for these the
# records also report GB/s against a plain copy.
MEMORY_BOUND = {"dw_3x3", "dw_5x5", "stem_7x7", "rgb_3x5", "depthwise_3x3"}
PASSES = ["forward", "backward_input", "backward_weight", "step"]
PRECISIONS = ["tf32", "ieee"]


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


def _make_inputs(shape, device, dtype=torch.float32, generator=None):
    x = torch.randn(shape.n, shape.cin, shape.h, shape.w, device=device, dtype=dtype, generator=generator)
    w = torch.randn(shape.cout, shape.cin // shape.groups, *shape.kernel, device=device, dtype=dtype,
                    generator=generator)
    # Scale so outputs stay O(1) whatever the reduction length.
    w /= math.sqrt(w[0].numel())
    gy = torch.randn(shape.n, shape.cout, *shape.out_hw(), device=device, dtype=dtype, generator=generator)
    return x, w, gy


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
            if timing == "gpu" and 2 * host_ms > hold_ms:
                hold_ms = 4 * host_ms  # the GPU may have waited for the host: sample again
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


def min_bytes(shape, pass_):
    """The fewest bytes a pass must move in float32: each input read once,
    the output written once. forward: x + w + y; backward_input:
    grad_output + w + grad_input; backward_weight: grad_output + x +
    grad_weight; a step runs all three passes, so it is their sum."""
    x = shape.n * shape.cin * shape.h * shape.w
    w = shape.cout * (shape.cin // shape.groups) * shape.kernel[0] * shape.kernel[1]
    y = shape.n * shape.cout * math.prod(shape.out_hw())
    elements = {"forward": x + w + y, "backward_input": y + w + x, "backward_weight": y + x + w}
    elements["step"] = sum(elements.values())
    return 4 * elements[pass_]


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
    precision mode (which conv2d_ext follows too)."""
    return torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False,
                                      allow_tf32=precision == "tf32")


def run(shapes, passes, precisions, device, quick=False, progress=print, timing="gpu"):
    records = []
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 32 << 20
    warmup, repeats, budget = (1, 5, 0.3) if quick else (3, 30, 1.5)
    total = len(shapes) * len(passes) * len(precisions)
    done = 0
    copy = None  # copy GB/s: measured once, and only if a memory-bound shape runs
    for name in shapes:
        shape = SUITE[name] if device.type == "cuda" else SUITE[name].reduced()
        set_bytes = sum(t.numel() * 4 for t in _make_inputs(shape, "meta"))
        n_sets = max(1, min(4, math.ceil(2 * l2 / set_bytes)))
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()))
        sets = [_make_inputs(shape, device, generator=gen) for _ in range(n_sets)]
        if name in MEMORY_BOUND and copy is None:
            copy = copy_gbps(device, warmup, repeats, budget, timing)
            progress(f"copy: {copy:.1f} GB/s")
        for pass_ in passes:
            ext, ref_fn = _ext_fn(pass_, shape, device), _torch_fn(pass_, shape, device)
            x, w, gy = sets[0]
            with _cudnn("ieee"):
                if pass_ == "step":  # float64 through the functional path
                    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
                    y64 = F.conv2d(x64, w64, None, *shape.geometry())
                    reference = (y64.detach(), *torch.autograd.grad(y64, (x64, w64), gy.double()))
                else:
                    reference = _torch_fn(pass_, shape)(x.double(), w.double(), gy.double())
            for precision in precisions:
                with _cudnn(precision):
                    ext_err = rel_err(ext(x, w, gy), reference)
                    torch_err = rel_err(ref_fn(x, w, gy), reference)
                    ext_ms = time_ms(ext, sets, device, warmup, repeats, budget, timing)
                    torch_ms = time_ms(ref_fn, sets, device, warmup, repeats, budget, timing)
                flops = shape.flops() * (3 if pass_ == "step" else 1)
                rec = {
                    "shape": name,
                    "pass": pass_,
                    "precision": precision,
                    "ext_ms": ext_ms,
                    "torch_ms": torch_ms,
                    "speedup": torch_ms / ext_ms,
                    "ext_tflops": flops / ext_ms / 1e9,
                    "torch_tflops": flops / torch_ms / 1e9,
                    "ext_rel_err": ext_err,
                    "torch_rel_err": torch_err,
                    "config": asdict(shape),
                }
                if name in MEMORY_BOUND:
                    nbytes = min_bytes(shape, pass_)
                    rec["min_bytes"] = nbytes
                    rec["ext_gbps"] = nbytes / ext_ms / 1e6
                    rec["torch_gbps"] = nbytes / torch_ms / 1e6
                    rec["copy_gbps"] = copy
                    rec["copy_fraction"] = rec["ext_gbps"] / copy
                records.append(rec)
                done += 1
                progress(f"[{done}/{total}] {name} {pass_} {precision}: ext {ext_ms:.3f} ms, "
                         f"torch {torch_ms:.3f} ms, speedup {rec['speedup']:.2f}x, "
                         f"err {ext_err:.2e} vs {torch_err:.2e}")
            del reference
        del sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return records


def format_table(records):
    header = ("shape", "pass", "prec", "ext ms", "torch ms", "ext TF/s", "torch TF/s", "ext GB/s", "copy %",
              "speedup", "ext err", "torch err")
    rows = [header]
    for r in records:
        # Bandwidth only for the memory-bound shapes' records.
        gbps = f"{r['ext_gbps']:.1f}" if "ext_gbps" in r else "-"
        copy = f"{100 * r['copy_fraction']:.0f}%" if "copy_fraction" in r else "-"
        rows.append((r["shape"], r["pass"], r["precision"], f"{r['ext_ms']:.3f}", f"{r['torch_ms']:.3f}",
                     f"{r['ext_tflops']:.2f}", f"{r['torch_tflops']:.2f}", gbps, copy, f"{r['speedup']:.2f}x",
                     f"{r['ext_rel_err']:.1e}", f"{r['torch_rel_err']:.1e}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(wd) for c, wd in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (wd + 2) for wd in widths) + "|")
    return "\n".join(lines)


def environment(device):
    env = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "conv2d_ext": conv2d_ext.__version__,
        "build": conv2d_ext.build_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return env


def _csv(value, choices, what):
    items = [v for v in value.split(",") if v]
    bad = [v for v in items if v not in choices]
    if bad:
        raise SystemExit(f"unknown {what}: {', '.join(bad)} (choose from {', '.join(choices)})")
    return items


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m conv2d_ext.benchmark", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SUITE), help="comma-separated names from the suite")
    parser.add_argument("--passes", default=",".join(PASSES))
    parser.add_argument("--precision", default=",".join(PRECISIONS), help="tf32, ieee or both")
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--timing", choices=["gpu", "call"], default="gpu",
                        help="gpu: the GPU's time of each call, its host dispatch hidden behind a spin kernel "
                             "(default); call: from an idle GPU, the host's dispatch and launch included")
    parser.add_argument("--json", metavar="PATH", help="write the records and environment as JSON")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    shapes = _csv(args.shapes, list(SUITE), "shape")
    passes = _csv(args.passes, PASSES, "pass")
    precisions = _csv(args.precision, PRECISIONS, "precision")
    device = torch.device(args.device)
    if device.type == "cpu":
        precisions = ["ieee"]  # TF32 is a GPU mode
        print("no GPU: timing the CPU path on reduced sizes", file=sys.stderr)
    env = environment(device)
    print(f"# {env['device']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}", file=sys.stderr)
    env["timing"] = args.timing if device.type == "cuda" else "wall"
    records = run(shapes, passes, precisions, device, args.quick,
                  progress=lambda s: print(s, file=sys.stderr, flush=True), timing=args.timing)
    print(format_table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**env, "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
