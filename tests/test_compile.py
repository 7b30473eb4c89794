"""torch.compile(fullgraph=True, dynamic=True) equals eager, forward and
backward (the backward graph is compiled by AOTAutograd), and does not
recompile across batch sizes."""
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import conv2d_ext
from utils import DEVICES, rel_err, tolerance


@pytest.mark.parametrize("device", DEVICES)
def test_compile_forward_backward(device):
    torch._dynamo.reset()
    conv = conv2d_ext.Conv2d(3, 4, (3, 5), padding=(1, 2), stride=(1, 2), device=device, dtype=torch.float64)

    def f(x):
        return torch.relu(conv(x)) * 2

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    params = [conv.weight, conv.bias]
    for batch in (2, 3, 5):
        x = torch.randn(batch, 3, 10, 12, device=device, dtype=torch.float64, requires_grad=True)
        results = []
        for fn in (f, compiled):
            y = fn(x)
            grads = torch.autograd.grad(y.square().sum(), [x, *params])
            results.append((y, grads))
        (y_ref, g_ref), (y, g) = results
        assert rel_err(y, y_ref) <= tolerance(torch.float64, "ieee", 45)
        for a, b in zip(g, g_ref):
            assert rel_err(a, b) <= tolerance(torch.float64, "ieee", 45 * batch * 60)
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
