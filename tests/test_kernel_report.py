"""The `_kernel` query: which kernel variant a pass runs, as the plan and
each family's choose_* functions decide it (docs/kernels.md). The host-only
cases run without a GPU: the answer depends on the shape, the compute
capability passed in, the options and the precision flag, not on a device."""
import pytest
import torch

import conv2d_ext  # noqa: F401  (registers the ops)
from utils import option, tf32_mode

ops = torch.ops.conv2d_ext
PASSES = ["forward", "backward_input", "backward_weight"]


@pytest.fixture
def ieee():
    with tf32_mode(False):
        yield


@pytest.fixture
def tf32():
    with tf32_mode(True):
        yield


def kernel(pass_, x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1, sm=80,
           dtype=torch.float32):
    x = torch.empty(x_shape, dtype=dtype, device="meta")
    w = torch.empty(w_shape, dtype=dtype, device="meta")
    pair = lambda v: [v, v] if isinstance(v, int) else list(v)  # noqa: E731
    return ops._kernel(pass_, x, w, pair(stride), pair(padding), pair(dilation), groups, sm)


def words(report):
    algo, *rest = report.split()
    return algo, dict(r.split("=") for r in rest)


STEM = dict(x_shape=(2, 3, 224, 224), w_shape=(64, 3, 7, 7), stride=2, padding=3)


def test_stem_dgrad_in_ieee_mode_takes_wide_pair_tiles(ieee):
    algo, v = words(kernel("backward_input", **STEM))
    assert algo == "few_channels"
    assert v == {"size": "specialised", "pitch": "fixed", "pairs": "1", "tile": "wide"}


def test_stem_dgrad_tiles_follow_their_options(ieee):
    with option("few_channels_dgrad_wide", False):
        assert words(kernel("backward_input", **STEM))[1]["tile"] == "narrow"
    with option("few_channels_dgrad_pairs", False):
        v = words(kernel("backward_input", **STEM))[1]
        assert (v["pairs"], v["tile"]) == ("0", "narrow")


def test_stem_dgrad_of_narrow_phases_keeps_narrow_tiles(ieee):
    # 64-column phases fit the narrow tiles; wide ones are for 65 to 112.
    v = words(kernel("backward_input", (2, 3, 128, 128), (64, 3, 7, 7), 2, 3))[1]
    assert (v["pairs"], v["tile"]) == ("1", "narrow")


def test_dgrad_of_a_size_not_compiled_runs_the_generic_gather(ieee):
    v = words(kernel("backward_input", (2, 3, 64, 64), (16, 3, 5, 9), 2, (2, 4)))[1]
    assert v == {"size": "generic", "pitch": "generic", "pairs": "0", "tile": "narrow"}


def test_dgrad_halo_past_the_fixed_pitch_runs_the_generic_gather(ieee):
    # A compiled size whose grad_output reach (dilation 8) is wider than the pitch.
    v = words(kernel("backward_input", (2, 3, 200, 200), (16, 3, 7, 7), 2, 24, (1, 30)))[1]
    assert (v["size"], v["pitch"]) == ("specialised", "generic")


def test_stem_in_tf32_mode_runs_on_tensor_cores(tf32):
    for pass_ in PASSES:
        algo, v = words(kernel(pass_, **STEM))
        assert algo == "few_channels_tc"
        assert v["math"] == "tf32"
    assert words(kernel("backward_weight", **STEM))[1]["sm90"] == "0"


def test_stem_wgrad_in_ieee_mode_splits_operands(ieee):
    algo, v = words(kernel("backward_weight", **STEM))
    assert (algo, v["math"]) == ("few_channels_tc", "tf32x3")


@pytest.mark.parametrize("k, odd_lead", [(3, "1"), (5, "0")])
def test_depthwise_forward_takes_tall_pair_tiles(k, odd_lead):
    # 56 output rows: one 56-row tile. Padding k // 2: odd for 3x3, even for 5x5.
    algo, v = words(kernel("forward", (2, 32, 56, 56), (32, 1, k, k), 1, k // 2, groups=32))
    assert algo == "few_channels"
    assert v == {"size": "specialised", "tile": "tall", "pairs": "1", "odd_lead": odd_lead}


def test_depthwise_forward_of_58_rows_keeps_32_row_tiles():
    # Two 32-row tiles waste less than two 56-row ones.
    v = words(kernel("forward", (2, 32, 58, 60), (32, 1, 3, 3), 1, 1, groups=32))[1]
    assert (v["tile"], v["pairs"]) == ("narrow", "0")


def test_depthwise_forward_of_odd_width_has_no_odd_lead():
    # Rows not 16-byte aligned are staged without the 4-aligned lead.
    v = words(kernel("forward", (2, 32, 56, 57), (32, 1, 3, 3), 1, 1, groups=32))[1]
    assert (v["pairs"], v["odd_lead"]) == ("1", "0")


def test_depthwise_dgrad_runs_on_the_forward_and_wgrad_on_narrow_tiles():
    shape = dict(x_shape=(2, 32, 56, 56), w_shape=(32, 1, 3, 3), padding=1, groups=32)
    v = words(kernel("backward_input", **shape))[1]
    assert v["as"] == "forward" and v["tile"] == "tall"
    assert words(kernel("backward_weight", **shape)) == (
        "few_channels", {"size": "specialised", "tile": "narrow"})


def test_strided_depthwise_forward_has_no_pairs():
    v = words(kernel("forward", (2, 32, 56, 56), (32, 1, 3, 3), 2, 1, groups=32))[1]
    assert v["pairs"] == "0"


def test_tensor_core_layers_report_their_layout(tf32):
    algo, v = words(kernel("forward", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1))
    assert algo == "implicit_gemm" and v == {"math": "tf32", "rows_per_stage": "3"}
    algo, v = words(kernel("backward_weight", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1))
    assert algo == "implicit_gemm" and v["taps"] == "9"
    algo, v = words(kernel("backward_input", (8, 64, 56, 56), (128, 64, 3, 3), 2, 1))
    assert (algo, v) == ("dgrad_phases", {"phases": "4"})


def test_direct_reports_only_the_algorithm_and_the_cpu_its_instruction_set():
    assert kernel("forward", (2, 8, 16, 16), (8, 8, 3, 3), dtype=torch.float64) == "direct"
    assert kernel("forward", (2, 8, 16, 16), (8, 8, 3, 3), sm=0, dtype=torch.float64) == "direct"
    # NCHW depthwise dgrad strided in rows alone stays on the direct loop; at
    # column stride 2 it runs a depthwise kernel of its own (no phases); an
    # RGB stem's (3 output channels) runs the narrow forward by phases.
    assert kernel("backward_input", (2, 8, 16, 16), (8, 1, 3, 3), (2, 1), groups=8,
                  sm=0) == "direct"
    algo, v = words(kernel("backward_input", (2, 8, 16, 16), (8, 1, 3, 3), 2, groups=8, sm=0))
    assert algo == "cpu_depthwise" and "phases" not in v
    algo, v = words(kernel("backward_input", (2, 3, 16, 16), (8, 3, 3, 3), 2, sm=0))
    assert algo == "cpu_narrow" and v["phases"] == "4"
    algo, v = words(kernel("forward", (2, 8, 16, 16), (32, 8, 3, 3), sm=0))
    assert algo == "cpu_blocked" and v["isa"] in ("avx512", "avx2", "default")
    algo, v = words(kernel("backward_input", (2, 8, 16, 16), (8, 8, 3, 3), 2, sm=0))
    assert algo == "cpu_blocked" and v["phases"] == "4"
    algo, v = words(kernel("forward", (1, 8, 4, 4), (32, 8, 3, 3), sm=0))
    assert algo == "cpu_few_pixels" and v["isa"] in ("avx512", "avx2", "default")


@pytest.mark.parametrize("pass_", PASSES)
def test_the_report_starts_with_the_plans_algorithm(pass_):
    for shape in [STEM, dict(x_shape=(2, 32, 56, 56), w_shape=(32, 1, 3, 3), groups=32),
                  dict(x_shape=(4, 64, 28, 28), w_shape=(64, 64, 3, 3), padding=1)]:
        x = torch.empty(shape["x_shape"])
        w = torch.empty(shape["w_shape"])
        s, p, g = shape.get("stride", 1), shape.get("padding", 0), shape.get("groups", 1)
        algo = ops._algorithm(pass_, x, w, [s, s], [p, p], [1, 1], g)
        assert kernel(pass_, sm=0, **shape).split()[0] == algo  # CPU tensors: sm 0


def test_unknown_pass_is_an_error():
    with pytest.raises(RuntimeError, match="unknown pass 'backward'"):
        kernel("backward", (1, 3, 8, 8), (4, 3, 3, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("pass_", PASSES)
def test_on_this_gpu_the_report_agrees_with_the_algorithm_and_flat_layout(pass_, tf32):
    major, minor = torch.cuda.get_device_capability()
    sm = 10 * major + minor
    for shape in [STEM, dict(x_shape=(8, 32, 128, 128), w_shape=(64, 32, 5, 9), padding=(2, 4)),
                  dict(x_shape=(8, 64, 14, 14), w_shape=(64, 64, 3, 3), padding=1),
                  dict(x_shape=(2, 32, 56, 56), w_shape=(32, 1, 3, 3), padding=1, groups=32)]:
        x = torch.empty(shape["x_shape"], device="cuda")
        w = torch.empty(shape["w_shape"], device="cuda")
        s, p, g = shape.get("stride", 1), shape.get("padding", 0), shape.get("groups", 1)
        pair = lambda v: [v, v] if isinstance(v, int) else list(v)  # noqa: E731
        args = (x, w, pair(s), pair(p), [1, 1], g)
        report = ops._kernel(pass_, *args, sm)
        algo, v = words(report)
        assert algo == ops._algorithm(pass_, *args)
        if algo == "implicit_gemm_sm90_flat":
            assert int(v["shifts"]) == ops._flat_row_shifts(pass_, *args)
            assert int(v["segments"]) == ops._flat_segments(pass_, *args)


@pytest.mark.default_wgrad_routing
def test_ieee_short_wgrad_runs_the_engine_on_ffma(ieee):
    """IEEE mode's short channels_last wgrads (N*P*Q below 8192, from 256)
    run the engine's FFMA wgrad, or the direct kernel with the option
    nhwc_ieee_wgrad off; long ones, shorter ones and NCHW ones (but on
    copies, nhwc_copies) never go there."""
    def cl_kernel(x_shape, w_shape, **kw):
        x = torch.empty(x_shape, device="meta").to(memory_format=torch.channels_last)
        w = torch.empty(w_shape, device="meta").to(memory_format=torch.channels_last)
        return ops._kernel("backward_weight", x, w, [1, 1], [1, 1], [1, 1], 1, 90)

    short = ((8, 256, 7, 7), (256, 256, 3, 3))  # 392 products a weight
    long = ((8, 64, 56, 56), (64, 64, 3, 3))  # 25088
    tiny = ((2, 256, 7, 7), (256, 256, 3, 3))  # 98: the direct kernel's tree
    assert words(cl_kernel(*short)) == ("implicit_gemm_nhwc", {"math": "ffma"})  # the default
    assert words(cl_kernel(*tiny))[0] == "direct"
    with option("nhwc_ieee_wgrad", False):
        assert words(cl_kernel(*short))[0] == "direct"
    with option("nhwc_ieee_wgrad", True):
        assert words(cl_kernel(*short)) == ("implicit_gemm_nhwc", {"math": "ffma"})
        assert words(cl_kernel(*long))[0] != "implicit_gemm_nhwc"
        with option("nhwc_copies", False):  # else NCHW calls take channels_last copies
            assert words(kernel("backward_weight", *short, padding=1, sm=90))[0] == "direct"
        with option("nhwc_wgrad", False):
            assert words(cl_kernel(*short))[0] == "direct"
    with tf32_mode(True):
        assert words(cl_kernel(*short)) == ("implicit_gemm_nhwc", {"math": "tf32"})


@pytest.mark.default_wgrad_routing
def test_nchw_calls_run_the_engine_on_copies_only_when_asked():
    """Option nhwc_copies (on): NCHW calls whose NCHW kernel loses to the engine
    (here the mma.sync wgrad of a 14x14 stride-2 projection in TF32 mode,
    a bfloat16 wgrad, IEEE mode's short wgrad) run it on channels_last
    copies on sm_90, reported as copies=channels_last; never below sm_90, never where the engine does not take the operands
    (the RGB stem, IEEE mode's forward), never with the option off."""
    proj = ((32, 1024, 14, 14), (2048, 1024, 1, 1))
    short = ((8, 256, 7, 7), (256, 256, 3, 3))

    def report(pass_, shapes, dtype=torch.float32, sm=90, **kw):
        return words(kernel(pass_, *shapes, sm=sm, dtype=dtype, **kw))

    with tf32_mode(True):
        with option("nhwc_copies", False):
            assert "copies" not in report("backward_weight", proj, stride=2)[1]
        with option("nhwc_copies", True):
            assert report("backward_weight", proj, stride=2) == (
                "implicit_gemm_nhwc", {"copies": "channels_last", "math": "tf32"})
            assert report("backward_weight", proj, dtype=torch.bfloat16, stride=2) == (
                "implicit_gemm_nhwc", {"copies": "channels_last", "math": "bf16"})
            assert "copies" not in report("backward_weight", proj, sm=80, stride=2)[1]
            assert report("forward", ((2, 3, 224, 224), (64, 3, 7, 7)), stride=2,
                          padding=3)[0] != "implicit_gemm_nhwc"
    with tf32_mode(False), option("nhwc_copies", True):
        assert report("backward_weight", short, padding=1) == (
            "implicit_gemm_nhwc", {"copies": "channels_last", "math": "ffma"})
        assert "copies" not in report("forward", short, padding=1)[1]
