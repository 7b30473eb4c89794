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
    previous = torch.ops.conv2d_ext._set_option("poison_outputs", True)
    yield
    torch.ops.conv2d_ext._set_option("poison_outputs", previous)


@pytest.fixture(autouse=True)
def tensor_core_wgrad_on_short_reductions(request):
    """In IEEE mode the plan sends wgrad of short reductions (N*Ho*Wo
    below 8192) to the direct FFMA kernel, for accuracy; the suite's small
    shapes would then never reach the 3xTF32 tensor-core wgrad. So tests
    keep those on tensor cores, except tests marked default_wgrad_routing
    (the precision contract and the routing itself)."""
    if request.node.get_closest_marker("default_wgrad_routing"):
        yield
        return
    previous = torch.ops.conv2d_ext._set_option("short_wgrad_direct", False)
    yield
    torch.ops.conv2d_ext._set_option("short_wgrad_direct", previous)


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
