"""PyTorch's own conv2d cases: every sample input of the OpInfo for
nn.functional.conv2d matches F.conv2d (output and gradients), and every
error input raises."""
import pytest
import torch
import torch.nn.functional as F

# PyTorch's test utilities need expecttest (a test requirement, README):
# without it this module skips instead of stopping the whole run.
pytest.importorskip("expecttest", reason="PyTorch's OpInfo database needs expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

import conv2d_ext
from utils import DEVICES, rel_err, tolerance

OPINFO = next(op for op in op_db if op.name == "nn.functional.conv2d" and op.variant_test_name == "")


def _reference(args, kwargs, gy, absolute):
    """F.conv2d in float64 with its gradients; on absolute values when
    `absolute`, for the error measure's magnitude floor."""
    def prep(t):
        if not isinstance(t, torch.Tensor):
            return t
        t = t.detach().double()
        return (t.abs() if absolute else t).requires_grad_(True)

    ref_args = [prep(t) for t in args]
    y = F.conv2d(*ref_args, **kwargs)
    leaves = [r for t, r in zip(args, ref_args) if isinstance(t, torch.Tensor) and t.requires_grad]
    gy = gy.detach().double()
    return (y.detach(), *torch.autograd.grad(y, leaves, gy.abs() if absolute else gy))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_sample_inputs(device, dtype):
    samples = list(OPINFO.sample_inputs(device, dtype, requires_grad=True))
    assert len(samples) >= 10
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for sample in samples:
            args = (sample.input, *sample.args)
            y = conv2d_ext.conv2d(*args, **sample.kwargs)
            gy = torch.randn_like(y)
            leaves = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
            outs = (y, *torch.autograd.grad(y, leaves, gy))
            refs = _reference(args, sample.kwargs, gy, absolute=False)
            mags = _reference(args, sample.kwargs, gy, absolute=True)
            weight = sample.args[0]
            groups = sample.kwargs.get("groups", 1)
            y4 = y if y.dim() == 4 else y.unsqueeze(0)
            # The longest reduction of the three passes bounds them all.
            length = max(weight[0].numel(), weight.shape[0] // groups * weight[0, 0].numel(),
                         y4.shape[0] * y4.shape[2] * y4.shape[3])
            tol = tolerance(dtype, "ieee", length)
            assert len(outs) == len(refs)
            for out, ref, mag in zip(outs, refs, mags):
                assert out.shape == ref.shape, sample
                assert rel_err(out, ref, mag, length) <= tol, sample


@pytest.mark.parametrize("device", DEVICES)
def test_error_inputs(device):
    errors = list(OPINFO.error_inputs(device))
    assert errors
    for error in errors:
        sample = error.sample_input
        with pytest.raises(error.error_type):
            conv2d_ext.conv2d(sample.input, *sample.args, **sample.kwargs)
