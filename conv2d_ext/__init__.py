"""conv2d_ext: 2-D convolution for PyTorch with its own CPU and CUDA kernels.

    conv2d_ext.conv2d(...)           # same signature as F.conv2d
    conv2d_ext.Conv2d(...)           # drop-in for nn.Conv2d
    conv2d_ext.convert(model)        # swap every nn.Conv2d in a model
    torch.ops.conv2d_ext.conv2d      # the op itself (autograd and fake kernels registered)
"""
from ._loader import build_info, load_library
from .version import __version__

load_library()

from . import _ops  # noqa: E402  registers fake kernels
from .functional import conv2d  # noqa: E402
from .modules import Conv2d, convert  # noqa: E402

__all__ = ["Conv2d", "__version__", "build_info", "conv2d", "convert"]
