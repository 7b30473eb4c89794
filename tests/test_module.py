"""conv2d_ext.Conv2d as a drop-in for nn.Conv2d, and convert()."""
import copy

import pytest
import torch
import torch.nn as nn

import conv2d_ext
from utils import DEVICES, rel_err, tolerance


def test_constructor_matches_nn_conv2d():
    ours = conv2d_ext.Conv2d(4, 6, (3, 5), stride=2, padding=(1, 2), dilation=(2, 1), groups=2,
                             bias=False, padding_mode="reflect", dtype=torch.float64)
    ref = nn.Conv2d(4, 6, (3, 5), stride=2, padding=(1, 2), dilation=(2, 1), groups=2,
                    bias=False, padding_mode="reflect", dtype=torch.float64)
    assert isinstance(ours, nn.Conv2d)
    assert ours.weight.shape == ref.weight.shape and ours.weight.dtype == torch.float64
    assert ours.bias is None and repr(ours).split("(", 1)[1] == repr(ref).split("(", 1)[1]
    before = ours.weight.detach().clone()
    ours.reset_parameters()
    assert not torch.equal(before, ours.weight)


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_round_trip(device):
    ours = conv2d_ext.Conv2d(3, 5, 3, padding=1, device=device, dtype=torch.float64)
    ref = nn.Conv2d(3, 5, 3, padding=1, device=device, dtype=torch.float64)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 8, 9, device=device, dtype=torch.float64)
    assert rel_err(ours(x), ref(x)) <= tolerance(torch.float64, "ieee", 27)
    back = conv2d_ext.Conv2d(3, 5, 3, padding=1, device=device, dtype=torch.float64)
    back.load_state_dict(ref.state_dict())
    assert torch.equal(back.weight, ours.weight) and torch.equal(back.bias, ours.bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding", [(1, 2), "same", "valid"])
def test_padding_modes(device, padding_mode, padding):
    ref = nn.Conv2d(4, 6, (3, 4), padding=padding, padding_mode=padding_mode, groups=2,
                    device=device, dtype=torch.float64)
    ours = conv2d_ext.Conv2d(4, 6, (3, 4), padding=padding, padding_mode=padding_mode, groups=2,
                             device=device, dtype=torch.float64)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 9, 10, device=device, dtype=torch.float64, requires_grad=True)
    y_ref, y = ref(x), ours(x)
    assert y.shape == y_ref.shape
    assert rel_err(y, y_ref) <= tolerance(torch.float64, "ieee", 24)
    gy = torch.randn_like(y)
    g_ref = torch.autograd.grad(y_ref, [x, ref.weight, ref.bias], gy)
    g = torch.autograd.grad(y, [x, ours.weight, ours.bias], gy)
    for a, b in zip(g, g_ref):
        assert rel_err(a, b) <= tolerance(torch.float64, "ieee", 2 * 9 * 10)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.block = nn.Sequential(
            nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(),
            nn.Conv2d(8, 16, 1), nn.ReLU(),
            nn.Conv2d(16, 16, (5, 9), padding="same", padding_mode="reflect", groups=4),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.block(torch.relu(self.bn(self.stem(x))))
        return self.head(x.mean((2, 3)))


@pytest.mark.parametrize("device", DEVICES)
def test_convert_small_cnn(device):
    model = SmallCNN().to(device=device, dtype=torch.float64)
    converted = conv2d_ext.convert(copy.deepcopy(model))
    convs = [m for m in converted.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 4 and all(type(m) is conv2d_ext.Conv2d for m in convs)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), converted.state_dict().values()))
    x = torch.randn(2, 3, 32, 30, device=device, dtype=torch.float64)
    y_ref, y = model(x), converted(x)
    assert rel_err(y, y_ref) <= tolerance(torch.float64, "ieee", 16 * 45)
    y_ref.square().sum().backward()
    y.square().sum().backward()
    for (name, p_ref), p in zip(model.named_parameters(), converted.parameters()):
        assert rel_err(p.grad, p_ref.grad) <= tolerance(torch.float64, "ieee", 2 * 16 * 16), name


def test_convert_returns_model_and_leaves_subclasses():
    class MyConv(nn.Conv2d):
        pass

    model = nn.Sequential(nn.Conv2d(2, 2, 3), MyConv(2, 2, 3))
    assert conv2d_ext.convert(model) is model
    assert type(model[0]) is conv2d_ext.Conv2d and type(model[1]) is MyConv
    conv = nn.Conv2d(2, 2, 1)
    assert type(conv2d_ext.convert(conv)) is conv2d_ext.Conv2d
