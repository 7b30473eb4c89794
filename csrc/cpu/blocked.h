// The register-blocked float32 forward on the CPU (blocked.cpp): a block
// of output pixels of one row times a block of output channels kept in
// vector registers, accumulated over (input channel, tap) as outer
// products of broadcast input values and packed weight vectors. One build
// serves AVX-512, AVX2 and plain x86-64: the micro-kernel is compiled for
// each and picked at run time.
#pragma once

#include <string>

#include "../conv_params.h"

namespace conv2d_ext {
namespace cpu {

// Whether the blocked kernel takes the problem: output channels per group
// fill at least a quarter of its channel block (depthwise and other narrow
// groups keep the direct loop, which wastes nothing on them).
bool blocked_fits(const ConvParams& p);

// y = conv(x, w) + bias, all NCHW contiguous float32, bias null or [K].
// Also dgrad: p = dgrad_as_fprop(layer) (a stride phase's forward), x =
// grad_output, w = the weight transposed per group and flipped, or with
// WeightOrder::kDgrad the layer's own weight (unit stride).
void fprop_blocked(const ConvParams& p, const float* x, const float* w, const float* bias,
                   float* y, WeightOrder order = WeightOrder::kFprop);

// The same over channels_last x and y ([N][H][W][C]; w still NCHW), any
// groups: each pixel's channels (a group's among them) are a run, so the
// outputs leave the registers as they are held, pixel by pixel; a task is
// an output row of every group, its input rows gathered once.
bool blocked_nhwc_fits(const ConvParams& p);
void fprop_blocked_nhwc(const ConvParams& p, const float* x, const float* w, const float* bias,
                        float* y, WeightOrder order = WeightOrder::kFprop);

// grad_w (NCHW [K][C per group][R][S], float32) of a layer from
// grad_output and x (NCHW contiguous): the same blocking with output
// channels x (channel, tap) entries in registers, summed over every pixel.
// Fits where blocked_fits(p) does.
void wgrad_blocked(const ConvParams& p, const float* grad_out, const float* x, float* grad_w);

// The same over channels_last grad_output and x, writing a channels_last
// grad_w ([K][R][S][C per group]), any groups: grad_output's pixels are
// already runs of each group's channels, and the (tap, channel) entries
// read the input in order.
bool blocked_wgrad_nhwc_fits(const ConvParams& p);
void wgrad_blocked_nhwc(const ConvParams& p, const float* grad_out, const float* x,
                        float* grad_w);

// The depthwise forward (blocked.cpp): one input channel per group; each
// output plane alone, a row's pixels in vector registers (at column stride
// s over rows split into s phase rows). Also dgrad of such a layer with one
// output channel per group, as blocked_fits's forwards.
bool depthwise_fits(const ConvParams& p);
void fprop_depthwise(const ConvParams& p, const float* x, const float* w, const float* bias,
                     float* y);

// Depthwise dgrad at column stride 2 over NCHW grad_output and grad_input
// (p: the layer's; w [C][1][R][S], one output channel per input channel):
// each grad_input row's two column phases as vectors of consecutive
// grad_output columns, interleaved.
bool depthwise_dgrad_s2_fits(const ConvParams& p);
void dgrad_depthwise_s2(const ConvParams& p, const float* grad_out, const float* w,
                        float* grad_in);

// The depthwise forward over channels_last x and y (NHWC) and the weight
// (whose channels_last layout is its contiguous one), one output channel
// per input channel: channels in vector registers, no copy of the input.
bool depthwise_nhwc_fits(const ConvParams& p);
void fprop_depthwise_nhwc(const ConvParams& p, const float* x, const float* w, const float* bias,
                          float* y);

// Depthwise dgrad over channels_last grad_output and grad_input at any
// stride and dilation (p: the layer's; w [C][1][R][S], one output channel
// per input channel, depthwise_nhwc_fits(p)): each grad_input pixel sums
// the taps that reach it, by column phase, written in place.
void dgrad_depthwise_nhwc(const ConvParams& p, const float* grad_out, const float* w,
                          float* grad_in);

// Depthwise wgrad over channels_last grad_output and x, one output channel
// per input channel, at column stride 1 or 2 and unit column dilation with
// 3, 5 or 7 columns of taps: channels in vector registers, each input pixel's vector
// loaded once per kernel row for all the taps of the row that read it.
// grad_w [C][1][R][S] (its channels_last layout is the same).
bool depthwise_wgrad_nhwc_fits(const ConvParams& p);
void wgrad_depthwise_nhwc(const ConvParams& p, const float* grad_out, const float* x,
                          float* grad_w);

// The narrow kernels (blocked.cpp), for layers with few output channels
// per group (where blocked_fits does not hold). The forward (unit column
// stride, narrow_fits) keeps a row's pixels in vector registers for up to
// 4 output channels at a time (also dgrad, as blocked_fits's forwards);
// wgrad (any stride) keeps up to 16 (input channel, tap) entries of one
// output channel, summed over every pixel (depthwise layers' too).
bool narrow_fits(const ConvParams& p);
void fprop_narrow(const ConvParams& p, const float* x, const float* w, const float* bias,
                  float* y);
void wgrad_narrow(const ConvParams& p, const float* grad_out, const float* x, float* grad_w);

// The instruction set the micro-kernel runs with here: "avx512", "avx2" or
// "default".
std::string blocked_isa();

}  // namespace cpu
}  // namespace conv2d_ext
