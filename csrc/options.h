// The switches tests and A/B runs flip, in one place: one atomic each, set
// through one op (torch.ops.conv2d_ext._set_option(name, value)). Every
// default is what users run; the switches exist to keep a kernel variant
// covered on shapes where the plan prefers another, or to compare two.
#pragma once

#include <string>
#include <vector>

namespace conv2d_ext {

enum class Option : int {
  // Fill every output with NaN before kernels run, so that an element a
  // kernel never writes cannot pass (default off).
  kPoisonOutputs,
  // The plan may pick Hopper-only kernels (wgmma, the tensor-copy engine);
  // off runs the kernels other GPUs run.
  kHopperKernels,
  // The plan may pick the flat sm_90 forward; off keeps the other wgmma
  // forward covered on unit-stride shapes.
  kFlatKernels,
  // IEEE-mode wgrad of short reductions runs the direct FFMA kernel, for
  // accuracy; off keeps the 3xTF32 tensor-core wgrad covered on small shapes.
  kShortWgradDirect,
  // The few-channel tensor-core wgrad runs its 3xTF32 stage on wgmma on
  // Hopper; off runs it on mma.sync, as other GPUs do.
  kFewChannelsWgradSm90,
  // TF32-mode few-channel dgrad runs every stride phase at once on tensor
  // cores; off runs the FFMA gather.
  kFewChannelsDgradTc,
  // The FFMA gather takes two columns a thread on the phases it has
  // compiled for (stride 2, unit dilation); off takes one.
  kFewChannelsDgradPairs,
  // The FFMA gather starts its blocks heaviest (phase, tile) first within
  // groups of at most a wave; off keeps the grid's order (same bits).
  kFewChannelsDgradOrder,
  // The FFMA gather takes 16 x 112 tiles on phases of 65 to 112 columns
  // where every phase takes two columns a thread; off takes 32 x 64.
  kFewChannelsDgradWide,
  // The sm_90 3xTF32 wgrad skips the k8 steps of a K tile past the output's
  // right edge, in pairs; off runs them on zeros (same bits).
  kWgradEdgeSteps,
  // channels_last operands may run the channels_last engine (nhwc/); off
  // runs the NCHW kernels on copies, as before it.
  kNhwcKernels,
  // channels_last wgrad may run on the engine too; off runs the NCHW
  // kernels on copies.
  kNhwcWgrad,
  // On Hopper the engine's 128-row forward tiles run on wgmma; off keeps
  // its mma.sync kernel covered there.
  kNhwcWgmma,
  // On Hopper the engine's forward splits K over slices where its 128-row
  // tiles cannot fill the SMs.
  kNhwcSplitK,
  // On Hopper the engine's forward takes 128 x 256 tiles where at least
  // 256 output channels fill the SMs (off by default until measured).
  kNhwcWideTiles,
  // The CPU's blocked forward may use AVX-512, AVX2; off falls back to the
  // next narrower instruction set (tests cover all three on one machine).
  kCpuAvx512,
  kCpuAvx2,
  // The engine's wgmma forward leaves TF32 operands to the tensor cores,
  // which truncate, instead of rounding them to nearest in shared memory
  // first (off: TF32 mode rounds everywhere; on to measure its cost).
  kNhwcTf32Truncate,
  // float16 and bfloat16 operands of the engine run as they are (16-bit
  // MMAs): the forward and dgrad on Hopper's wgmma forward, the wgrad on
  // sm_80+; off runs them on float32 copies, as every other kernel does.
  kNhwc16Bit,
  // IEEE mode's short channels_last wgrad reductions (those 3xTF32 cannot
  // serve) run the engine's FFMA wgrad; off sends them to the direct kernel.
  kNhwcIeeeWgrad,
  // NCHW calls may run the channels_last engine on channels_last copies of
  // their operands, the result copied back, where the plan expects the NCHW
  // kernels to lose (plan.cpp, nhwc_on_copies).
  kNhwcCopies,
  // A strided dgrad's phases (one forward each, disjoint pixels of
  // grad_input) run side by side on streams of PyTorch's pool, forked from
  // the caller's stream and joined back (default off until measured).
  kDgradPhaseStreams,
  // IEEE mode's forward and dgrad of channels_last operands may run the
  // engine's wgmma forward in 3xTF32 on Hopper, and so may NCHW ones on
  // channels_last copies where nhwc_copies' bounds say (default off until
  // measured); off runs the NCHW kernels (on NCHW copies for
  // channels_last operands).
  kNhwcIeee,
  // The engine's wgmma forward keeps one K tile's wgmmas in flight while it
  // readies the next and meets the barrier (default off until measured);
  // off retires each tile's before the barrier.
  kNhwcWgmmaPipelined,
  // The engine's 3xTF32 forward (nhwc_ieee) retires its partial sums every
  // two k8 steps instead of every K tile's four: a shorter truncating chain
  // in the tensor cores, for accuracy on short reductions, at the cost of
  // a drain per K tile (default off until measured).
  kNhwcIeeeHalfParts,
};

// The current value (a relaxed load: a switch is flipped between calls).
bool option(Option o);

// Sets the switch named `name` (the enum's name in snake case, e.g.
// "hopper_kernels") and returns its previous value; an unknown name is an
// error that lists the known ones.
bool set_option(const std::string& name, bool value);

// Every switch's name, in the enum's order.
std::vector<std::string> option_names();

}  // namespace conv2d_ext
