"""The op as a citizen of the CUDA runtime: it launches on the current
stream, can be captured in a CUDA graph (directly and through
torch.compile(mode='reduce-overhead')), never synchronises with the host,
and runs on whichever GPU its inputs are on.

GPU only. CONV2D_EXT_TEST_STREAM=side (tests/conftest.py) runs the whole
suite on a side stream as well."""
import subprocess
import sys

import pytest
import torch
from torch._dynamo.utils import counters

import conv2d_ext
from utils import cuda_only, precision_of, reduction_lengths, reference, rel_err, tolerance

pytestmark = cuda_only
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")

ops = torch.ops.conv2d_ext
# 8 -> 16 channels, kernel 5x9: the tensor-core forward, direct dgrad and
# wgrad.
N, CIN, H, W, COUT, KERNEL = 2, 8, 12, 40, 16, (5, 9)
STRIDE, PADDING, DILATION, GROUPS = [1, 2], [2, 4], [1, 1], 1
GEOMETRY = (STRIDE, PADDING, DILATION, GROUPS)
NAMES = ["forward", "grad_input", "grad_weight", "grad_bias"]
# About half a second of spinning on a current GPU: far longer than the ops
# on these shapes take.
SLEEP_CYCLES = 1_000_000_000


def _inputs(device="cuda", requires_grad=False):
    x = torch.randn(N, CIN, H, W, device=device)
    w = torch.randn(COUT, CIN, *KERNEL, device=device)
    b = torch.randn(COUT, device=device)
    ho = H + 2 * PADDING[0] - DILATION[0] * (KERNEL[0] - 1)
    wo = (W + 2 * PADDING[1] - DILATION[1] * (KERNEL[1] - 1) - 1) // STRIDE[1] + 1
    gy = torch.randn(N, COUT, ho, wo, device=device)
    if requires_grad:
        for t in (x, w, b):
            t.requires_grad_()
    return x, w, b, gy


def _passes(x, w, b, gy):
    """Forward and both backward ops."""
    return (
        ops.conv2d(x, w, b, *GEOMETRY),
        ops.conv2d_backward_input(gy, w, list(x.shape), *GEOMETRY),
        ops.conv2d_backward_weight(gy, x, list(w.shape), *GEOMETRY),
    )


def _autograd_step(x, w, b, gy):
    """Forward through conv2d_ext.conv2d and its three gradients."""
    y = conv2d_ext.conv2d(x, w, b, STRIDE, PADDING, DILATION, GROUPS)
    return (y, *torch.autograd.grad(y, [x, w, b], gy))


def _check(outs, x, w, b, gy, what=""):
    """outs (forward, grad_input, grad_weight[, grad_bias]) against float64."""
    refs = reference(x, w, b, STRIDE, PADDING, DILATION, GROUPS, grad_out=gy)
    mags = reference(x, w, b, STRIDE, PADDING, DILATION, GROUPS, grad_out=gy, absolute=True)
    precision = precision_of(torch.float32, "cuda")
    k_fprop, k_dgrad, k_wgrad = reduction_lengths(x, w, refs[0])
    for name, out, ref, mag, length in zip(NAMES, outs, refs, mags, (k_fprop, k_dgrad, k_wgrad, k_wgrad)):
        err = rel_err(out, ref, mag, length)
        tol = tolerance(torch.float32, precision, length)
        assert err <= tol, f"{what}{name}: relative error {err:.3g} > {tol:.3g} ({precision})"


def test_side_stream_while_current_stream_busy():
    x, w, b, gy = _inputs()
    _passes(x, w, b, gy)  # warm-up: kernels loaded, memory cached
    torch.cuda.synchronize()
    busy = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(busy)  # the inputs are ready (nothing is pending)
    torch.cuda._sleep(SLEEP_CYCLES)  # on the busy stream
    with torch.cuda.stream(side):
        outs = _passes(x, w, b, gy)
        done = torch.cuda.Event()
        done.record()
        done.synchronize()
        busy_after_ops = not busy.query()
        # Copies on the side stream, which wait for the ops only if the ops
        # were launched on it; otherwise they read the NaN the outputs start
        # as.
        outs = [o.cpu() for o in outs]
    torch.cuda.synchronize()
    assert busy_after_ops, "the ops waited for the busy stream (or the sleep was too short)"
    _check(outs, x, w, b, gy, "side stream: ")

    # Producer on the busy stream, consumer on the side stream after
    # wait_stream: the ops see the data produced after the sleep.
    x2, gy2 = torch.full_like(x, float("nan")), torch.full_like(gy, float("nan"))
    torch.cuda._sleep(SLEEP_CYCLES // 4)
    x2.copy_(x)
    gy2.copy_(gy)
    side.wait_stream(busy)
    with torch.cuda.stream(side):
        outs = _passes(x2, w, b, gy2)
    for t in (x2, gy2):
        t.record_stream(side)  # allocated on the busy stream, used on the side one
    busy.wait_stream(side)
    _check(outs, x, w, b, gy, "after wait_stream: ")


def test_cuda_graph_forward_backward(precision):
    static_x, w, b, static_gy = _inputs(requires_grad=True)
    # Warm-up on a side stream, then capture, as PyTorch documents it.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            _autograd_step(static_x, w, b, static_gy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outs = _autograd_step(static_x, w, b, static_gy)

    for replay in range(2):
        new = _inputs()
        with torch.no_grad():
            for static, value in zip((static_x, w, b, static_gy), new):
                static.copy_(value)
        graph.replay()
        eager = _autograd_step(static_x, w, b, static_gy)
        # Same kernels on the same data as eager mode: identical results
        # (the bias gradient is PyTorch's own sum).
        for name, got, want in zip(NAMES[:3], static_outs, eager):
            assert torch.equal(got, want), f"replay {replay}: {name} differs from eager mode"
        _check(static_outs, *new, f"replay {replay}: ")


def test_compile_reduce_overhead():
    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Sequential(
        conv2d_ext.Conv2d(CIN, COUT, 3, padding=1),
        torch.nn.ReLU(),
        conv2d_ext.Conv2d(COUT, 4, KERNEL, padding=(2, 4), stride=(1, 2)),
    ).cuda()
    params = list(model.parameters())
    compiled = torch.compile(model, mode="reduce-overhead")
    precision = precision_of(torch.float32, "cuda")
    # Warm-up, recording, then replays.
    for step in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(N, CIN, H, W, device="cuda", requires_grad=True)
        y = compiled(x)
        gy = torch.randn_like(y)
        grads = torch.autograd.grad(y, [x, *params], gy)
        y_ref = model(x)
        grads_ref = torch.autograd.grad(y_ref, [x, *params], gy)
        assert rel_err(y, y_ref) <= tolerance(torch.float32, precision, COUT * KERNEL[0] * KERNEL[1])
        for i, (got, want) in enumerate(zip(grads, grads_ref)):
            err = rel_err(got, want)
            tol = tolerance(torch.float32, precision, N * H * W * COUT * 9)
            assert err <= tol, f"step {step}, gradient {i}: relative difference {err:.3g} from eager > {tol:.3g}"
    assert counters["inductor"]["cudagraph_skips"] == 0, "torch.compile skipped CUDA graphs"


def test_no_host_synchronisation():
    x, w, b, gy = _inputs(requires_grad=True)
    _passes(x, w, b, gy)
    _autograd_step(x, w, b, gy)  # warm-up: nothing left to load or allocate
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = _passes(x, w, b, gy)
        step = _autograd_step(x, w, b, gy)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    _check(outs, x, w, b, gy, "ops: ")
    _check(step, x, w, b, gy, "autograd: ")


@two_gpus
def test_second_gpu(precision):
    with torch.cuda.device(0):
        x, w, b, gy = _inputs("cuda:1", requires_grad=True)
        outs = _autograd_step(x, w, b, gy)
        ops_outs = _passes(x, w, b, gy)
        assert torch.cuda.current_device() == 0
    for out in (*outs, *ops_outs):
        assert out.device == torch.device("cuda:1")
    _check(outs, x, w, b, gy, "cuda:1, autograd: ")
    _check(ops_outs, x, w, b, gy, "cuda:1, ops: ")


_FIRST_BACKWARD = """
import torch, conv2d_ext
x = torch.randn(8, 64, 56, 56, device="cuda", requires_grad=True)
w = torch.randn(64, 64, 3, 3, device="cuda", requires_grad=True)
gy = torch.randn(8, 64, 56, 56, device="cuda")
torch.empty(1 << 28, device="cuda")  # freed at once: later allocations come from the cache
y = conv2d_ext.conv2d(x, w, None, 1, 1)
gx, gw = torch.autograd.grad(y, [x, w], gy)
torch.cuda.synchronize()
print(float(gx.double().norm()), float(gw.double().norm()))
"""


def test_first_backward_in_a_fresh_process():
    """The backward pass runs on autograd's worker thread. When the caching
    allocator serves all of its memory, nothing there has bound a CUDA
    context before the op's first driver call (the sm_90 kernels' tensor
    maps), which must bind one itself rather than fail."""
    run = subprocess.run([sys.executable, "-c", _FIRST_BACKWARD], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    norms = [float(v) for v in run.stdout.split()]
    assert len(norms) == 2 and all(v > 0 and v == v for v in norms), run.stdout
