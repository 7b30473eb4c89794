import os
import zlib

import pytest
import torch

import conv2d_ext  # noqa: F401  loads the ops
from utils import tf32_mode

HAS_CUDA = torch.cuda.is_available()

# CONV2D_EXT_TEST_STREAM=side runs every test with a fresh side stream as the
# current CUDA stream, instead of the default stream (docs/testing.md).
TEST_STREAM = os.environ.get("CONV2D_EXT_TEST_STREAM", "default")
if TEST_STREAM not in ("default", "side"):
    raise pytest.UsageError(f"CONV2D_EXT_TEST_STREAM={TEST_STREAM!r}: expected 'default' or 'side'")


@pytest.fixture(autouse=True, scope="session")
def poison_outputs():
    """Every op output starts as NaN, so an unwritten element fails."""
    previous = torch.ops.conv2d_ext._set_poison_outputs(True)
    yield
    torch.ops.conv2d_ext._set_poison_outputs(previous)


@pytest.fixture(autouse=True)
def fresh_seed(request):
    # A different but reproducible stream per test: inputs are fresh random
    # data for every case, never zeros.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def side_stream_mode():
    """With CONV2D_EXT_TEST_STREAM=side and a GPU: the whole test, its
    fixtures' setup after this one included, runs on a new side stream,
    ordered after everything before it on the default stream and before
    everything after it."""
    if TEST_STREAM != "side" or not HAS_CUDA:
        yield None
        return
    default = torch.cuda.current_stream()
    stream = torch.cuda.Stream()
    stream.wait_stream(default)
    with torch.cuda.stream(stream):
        yield stream
    default.wait_stream(stream)


@pytest.fixture(params=["ieee", "tf32"])
def precision(request):
    """Runs a test under both of PyTorch's convolution precision modes."""
    with tf32_mode(request.param == "tf32"):
        yield request.param
