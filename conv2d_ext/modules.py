"""conv2d_ext.Conv2d, a drop-in nn.Conv2d, and convert() for whole models."""
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.utils import _pair

from .functional import conv2d


class Conv2d(nn.Conv2d):
    """nn.Conv2d computed by conv2d_ext.

    A subclass that changes only the computation, so the constructor
    (device, dtype, padding_mode, ...), reset_parameters and the state_dict
    are nn.Conv2d's own and load into it and back."""

    def _conv_forward(self, input, weight, bias):
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv2d(input, weight, bias, self.stride, _pair(0), self.dilation, self.groups)
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


def convert(model):
    """Makes every nn.Conv2d in `model` a conv2d_ext.Conv2d and returns it.

    Modules change class in place, so parameters, buffers, hooks and the
    module tree stay exactly as they were. Subclasses of nn.Conv2d other
    than Conv2d itself are left alone: they may compute something else."""
    for module in model.modules():
        if type(module) is nn.Conv2d:
            module.__class__ = Conv2d
    return model
