"""PyTorch's semantics at the edges: the arguments torch.ops takes (as
torch.ops.aten.conv2d), and inputs without channels or images."""
import pytest
import torch
import torch.nn.functional as F

import conv2d_ext  # noqa: F401  loads the ops
from utils import DEVICES, precision_of, rel_err, tolerance

OP = torch.ops.conv2d_ext.conv2d
ATEN = torch.ops.aten.conv2d


def test_schema_is_atens():
    ours = str(OP.default._schema)
    atens = str(ATEN.default._schema)
    assert ours.startswith("conv2d_ext::conv2d(") and atens.startswith("aten::conv2d(")
    assert ours.split("(", 1)[1] == atens.split("(", 1)[1]


# name -> (PyTorch accepts it, call(t) -> (args, kwargs)). t holds x [2, 4,
# 9, 10], w [6, 4, 3, 3], wg [6, 2, 3, 3] (groups=2) and b [6].
FORMS = {
    "defaults": (True, lambda t: ((t.x, t.w), {})),
    "bias": (True, lambda t: ((t.x, t.w, t.b), {})),
    "bias None": (True, lambda t: ((t.x, t.w, None), {})),
    "lists": (True, lambda t: ((t.x, t.wg, t.b, [2, 1], [1, 2], [1, 2], 2), {})),
    "tuples": (True, lambda t: ((t.x, t.wg, t.b, (2, 1), (1, 2), (1, 2), 2), {})),
    "one-element lists": (True, lambda t: ((t.x, t.w, t.b, [2], [1], [2]), {})),
    "keywords": (True, lambda t: ((t.x, t.wg), dict(bias=t.b, stride=[2, 1], padding=[1, 2],
                                                     dilation=[1, 2], groups=2))),
    "some keywords": (True, lambda t: ((t.x, t.wg), dict(padding=[1, 1], groups=2))),
    "all keywords": (True, lambda t: ((), dict(input=t.x, weight=t.w, bias=t.b, stride=(1, 2)))),
    "positional, then keywords": (True, lambda t: ((t.x, t.w, t.b, [2, 1]), dict(dilation=[2, 1]))),
    "0-dim tensor groups": (True, lambda t: ((t.x, t.wg, None, [1, 1], [0, 0], [1, 1], torch.tensor(2)), {})),
    # SymInt[2] takes no plain int through torch.ops (only int[2] would).
    "plain ints": (False, lambda t: ((t.x, t.w, None, 1, 0, 1, 1), {})),
    "plain int stride": (False, lambda t: ((t.x, t.w, None, 2), {})),
    "plain int keyword": (False, lambda t: ((t.x, t.w), dict(padding=1))),
    "three-element stride": (False, lambda t: ((t.x, t.w, None, [1, 1, 1]), {})),
    "empty dilation": (False, lambda t: ((t.x, t.w, None, [1, 1], [0, 0], []), {})),
    "float stride": (False, lambda t: ((t.x, t.w, None, [1.0, 1.0]), {})),
    "float groups": (False, lambda t: ((t.x, t.wg, None, [1, 1], [0, 0], [1, 1], 2.0), {})),
    "list groups": (False, lambda t: ((t.x, t.wg, None, [1, 1], [0, 0], [1, 1], [2]), {})),
    "unknown keyword": (False, lambda t: ((t.x, t.w), dict(strides=[1, 1]))),
    "too many arguments": (False, lambda t: ((t.x, t.w, None, [1, 1], [0, 0], [1, 1], 1, 1), {})),
    "no weight": (False, lambda t: ((t.x,), {})),
}
# Refusals that come from the arguments' values, not from schema matching
# (where aten's message names its two overloads): the same message.
SAME_MESSAGE = {"three-element stride", "empty dilation"}


class _Tensors:
    def __init__(self, dtype, device):
        g = torch.Generator().manual_seed(0)
        self.x, self.w, self.wg, self.b = (
            torch.randn(*s, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
            for s in ((2, 4, 9, 10), (6, 4, 3, 3), (6, 2, 3, 3), (6,)))


def _call(op, args, kwargs):
    try:
        return op(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001  compared below
        return None, e


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", FORMS)
def test_argument_forms_as_aten(form, device):
    accepted, call = FORMS[form]
    ref, ref_error = _call(ATEN, *call(_Tensors(torch.float64, "cpu")))
    assert (ref_error is None) == accepted, ref_error
    out, error = _call(OP, *call(_Tensors(torch.float32, device)))
    if accepted:
        assert error is None, error
        assert out.dtype == torch.float32 and out.device.type == device
        # ref: F.conv2d in float64 (aten::conv2d on float64 inputs).
        assert rel_err(out, ref) <= tolerance(torch.float32, precision_of(torch.float32, device), 36)
    else:
        assert type(error) is type(ref_error), (error, ref_error)
        if form in SAME_MESSAGE:
            assert str(error) == str(ref_error)


# Problems with no work: (input, weight, keyword arguments). PyTorch gives
# an input without channels an output without channels (not bias-filled),
# and checks neither its kernel extent nor its rows.
EMPTY = [
    ((2, 0, 5, 5), (4, 0, 3, 3), {}),
    ((2, 0, 5, 5), (4, 0, 3, 3), dict(groups=2)),
    ((2, 0, 7, 6), (4, 0, 3, 2), dict(stride=2, padding=1, dilation=(1, 2))),
    ((0, 0, 5, 5), (4, 0, 3, 3), {}),
    ((2, 0, 0, 5), (4, 0, 1, 1), dict(padding=1)),
    ((2, 0, 5, 5), (4, 0, 0, 3), {}),
    ((0, 3, 5, 5), (4, 3, 3, 3), dict(padding=1)),
    ((0, 4, 5, 5), (6, 2, 3, 3), dict(groups=2)),
]
EXPECTED_SHAPES = [(2, 0, 3, 3), (2, 0, 3, 3), (2, 0, 4, 3), (0, 0, 3, 3), (2, 0, 2, 7), (2, 0, 6, 3),
                   (0, 4, 5, 5), (0, 6, 3, 3)]


def _forward_backward(fn, x, w, b, kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    y = fn(*leaves[:2], leaves[2] if b is not None else None, **kwargs)
    # Explicit grad_output: an empty y's sum would still reach every gradient.
    grads = torch.autograd.grad(y, leaves, torch.ones_like(y))
    return y, grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", range(len(EMPTY)))
def test_empty_problems_as_pytorch(case, bias, dtype, device):
    x_shape, w_shape, kwargs = EMPTY[case]
    x = torch.randn(x_shape, dtype=dtype, device=device)
    w = torch.randn(w_shape, dtype=dtype, device=device)
    b = torch.randn(w_shape[0], dtype=dtype, device=device) if bias else None
    y_ref, grads_ref = _forward_backward(F.conv2d, x, w, b, kwargs)
    y, grads = _forward_backward(conv2d_ext.conv2d, x, w, b, kwargs)
    assert y_ref.shape == EXPECTED_SHAPES[case]
    assert y.shape == y_ref.shape and y.dtype == dtype
    # Empty input and weight gradients, a zero bias gradient; the weight
    # gradient of an empty batch is zeros.
    for got, want in zip(grads, grads_ref):
        assert got.shape == want.shape and got.dtype == dtype
        assert torch.equal(got, want)
    if bias:
        assert torch.equal(grads[2], torch.zeros(w_shape[0], dtype=dtype, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_no_input_channels_backward_ops(device):
    """dgrad and wgrad take the channel-less grad_output the forward gives."""
    gy = torch.randn(2, 0, 3, 3, device=device)
    w = torch.randn(4, 0, 3, 3, device=device)
    x = torch.randn(2, 0, 5, 5, device=device)
    geometry = ([1, 1], [0, 0], [1, 1], 1)
    assert torch.ops.conv2d_ext.conv2d_backward_input(gy, w, [2, 0, 5, 5], *geometry).shape == (2, 0, 5, 5)
    assert torch.ops.conv2d_ext.conv2d_backward_weight(gy, x, [4, 0, 3, 3], *geometry).shape == (4, 0, 3, 3)
    # A grad_output with the weight's channels matches no forward output.
    with pytest.raises(RuntimeError, match=r"does not match the output size \[2, 0, 3, 3\]"):
        torch.ops.conv2d_ext.conv2d_backward_input(torch.randn(2, 4, 3, 3, device=device), w, [2, 0, 5, 5],
                                                   *geometry)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [0, 1, 3, 6])
def test_opcheck_empty(case, device):
    """The fake kernel gives the empty problems' shapes too (opcheck compares)."""
    x_shape, w_shape, kwargs = EMPTY[case]
    x = torch.randn(x_shape, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(w_shape, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(w_shape[0], dtype=torch.float64, device=device, requires_grad=True)
    args = (x, w, b, [kwargs.get("stride", 1)], [kwargs.get("padding", 0)], [1], kwargs.get("groups", 1))
    torch.library.opcheck(OP, args)
    with torch._subclasses.FakeTensorMode() as mode:
        fake = OP(mode.from_tensor(x), mode.from_tensor(w), mode.from_tensor(b), *args[3:])
    assert fake.shape == EXPECTED_SHAPES[case]


def test_fake_kernel_takes_one_element_lists():
    x, w = torch.randn(2, 4, 9, 10), torch.randn(6, 4, 3, 3)
    with torch._subclasses.FakeTensorMode() as mode:
        fake = OP(mode.from_tensor(x), mode.from_tensor(w), None, [2], [1], [2])
    assert fake.shape == OP(x, w, None, [2], [1], [2]).shape == (2, 6, 4, 4)
