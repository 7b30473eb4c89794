"""The op's switches (csrc/options.h): one setter by name, one list."""
import pytest
import torch

import conv2d_ext  # noqa: F401  (registers the ops)
from utils import option

ops = torch.ops.conv2d_ext

NAMES = ["poison_outputs", "hopper_kernels", "flat_kernels", "short_wgrad_direct",
         "few_channels_wgrad_sm90", "few_channels_dgrad_tc", "few_channels_dgrad_pairs",
         "few_channels_dgrad_order", "few_channels_dgrad_wide", "wgrad_edge_steps",
         "nhwc_kernels", "nhwc_wgrad", "nhwc_wgmma", "nhwc_split_k",
         "nhwc_wide_tiles", "cpu_avx512", "cpu_avx2",
         "nhwc_tf32_truncate", "nhwc_16bit", "nhwc_ieee_wgrad", "nhwc_copies",
         "dgrad_phase_streams", "nhwc_ieee",
         "nhwc_wgmma_pipelined", "nhwc_ieee_half_parts"]


def test_option_names():
    assert list(ops._option_names()) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_set_option_returns_the_previous_value(name):
    before = ops._set_option(name, True)
    try:
        assert ops._set_option(name, False) is True
        assert ops._set_option(name, False) is False
        with option(name, True):
            assert ops._set_option(name, True) is True
        assert ops._set_option(name, False) is False, "the context manager did not restore it"
    finally:
        ops._set_option(name, before)


def test_unknown_option_is_an_error_listing_the_known_ones():
    with pytest.raises(RuntimeError, match=r"unknown option 'hopper'.*known: poison_outputs, "):
        ops._set_option("hopper", True)


def test_the_suite_runs_with_poisoned_outputs():
    """conftest.py turns poisoning on for every test; the defaults users run
    are checked by the two-sided test above and by conftest's own restore."""
    assert ops._set_option("poison_outputs", True) is True
