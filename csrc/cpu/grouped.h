// The CPU's packed-group kernels (grouped.cpp): grouped layers over
// channels_last operands with as many output channels a group as input
// channels, and few of them (2, 4 or 8): several groups fill one vector of
// channels, where one group a block would leave most of its lanes empty
// and the NCHW kernels would need copies of the operands.
#pragma once

#include "../conv_params.h"

namespace conv2d_ext {
namespace cpu {

// Groups of 2, 4 or 8 input and output channels, at most half a vector
// (one instruction set's), and at least a vector of channels in all.
bool grouped_nhwc_fits(const ConvParams& p);

// y = conv(x, w) + bias: x [N][H][W][C] and y [N][P][Q][K] channels_last,
// w NCHW contiguous [K][C per group][R][S], bias null or [K]. Also dgrad as
// forwards (dgrad_as_fprop(p), one per stride phase, w the flipped weight
// per group).
void fprop_grouped_nhwc(const ConvParams& p, const float* x, const float* w, const float* bias,
                        float* y);

// grad_w [K][R][S][C per group] (a channels_last weight) from
// channels_last grad_output and x, where grouped_nhwc_fits, with 1, 3, 5 or
// 7 columns of taps.
bool grouped_wgrad_nhwc_fits(const ConvParams& p);
void wgrad_grouped_nhwc(const ConvParams& p, const float* grad_out, const float* x,
                        float* grad_w);

}  // namespace cpu
}  // namespace conv2d_ext
