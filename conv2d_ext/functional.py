"""conv2d_ext.conv2d: torch.nn.functional.conv2d's signature and semantics."""
import torch
import torch.nn.functional as F


def _pair(value):
    """An int or a 1- or 2-element sequence as a pair, as F.conv2d accepts."""
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    return value * 2 if len(value) == 1 else value


def _same_padding(input, weight, dilation):
    """'same' padding as PyTorch does it: the symmetric part goes to the op,
    the odd remainder (even effective kernel) is padded on the bottom/right."""
    total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
    left = [t // 2 for t in total]
    extra = [t - 2 * lo for t, lo in zip(total, left)]
    if any(extra):
        input = F.pad(input, (0, extra[1], 0, extra[0]))
    return input, left


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution over a batched (N, C, H, W) or unbatched (C, H, W) input.

    Same arguments and results as torch.nn.functional.conv2d; computed by
    conv2d_ext's kernels (torch.ops.conv2d_ext.conv2d)."""
    if input.dim() not in (3, 4):
        raise RuntimeError(
            "Expected 3D (unbatched) or 4D (batched) input to conv2d, "
            f"but got input of size: {list(input.shape)}"
        )
    unbatched = input.dim() == 3
    if unbatched:
        input = input.unsqueeze(0)
    stride = _pair(stride)
    dilation = _pair(dilation)
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0, 0)
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise RuntimeError("padding='same' is not supported for strided convolutions")
            if weight.dim() == 4:  # otherwise the op reports the bad weight
                input, padding = _same_padding(input, weight, dilation)
        else:
            raise RuntimeError(f"Invalid padding string: '{padding}', should be one of 'valid', 'same'")
    else:
        padding = _pair(padding)
    out = torch.ops.conv2d_ext.conv2d(input, weight, bias, stride, padding, dilation, groups)
    return out.squeeze(0) if unbatched else out
