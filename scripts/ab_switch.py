"""A/B of one of the op's test switches in one build and one process.

    python scripts/ab_switch.py few_channels_wgrad_sm90 --shapes stem_7x7,rgb_3x5 \
        --passes backward_weight,step [--precision tf32,ieee] [--rounds 2] [--quick]

Runs the benchmark's records (conv2d_ext.benchmark.run: CUDA events,
warm-up, median, inputs larger than L2, errors against float64) with
`torch.ops.conv2d_ext._set_option(switch, ...)` off and on, alternating for `rounds`
rounds, so both sides share the machine, its clocks and its build. Prints
the conv2d_ext times of every round side by side, with PyTorch's and both
errors. A switch is one of csrc/options.h's (torch.ops.conv2d_ext.
_option_names()).
"""
import argparse
import statistics
import sys

import torch

import conv2d_ext  # noqa: F401  (registers the ops)
from conv2d_ext import benchmark

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("switch", choices=list(torch.ops.conv2d_ext._option_names()))
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--passes", default=",".join(benchmark.PASSES))
    parser.add_argument("--precision", default=",".join(benchmark.PRECISIONS))
    parser.add_argument("--layout", default="nchw", help="nchw, channels_last or both")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    shapes = benchmark._csv(args.shapes, list(benchmark.SUITE), "shape")
    passes = benchmark._csv(args.passes, benchmark.PASSES, "pass")
    precisions = benchmark._csv(args.precision, benchmark.PRECISIONS + list(benchmark.HALF_PRECISIONS),
                                "precision")
    layouts = benchmark._csv(args.layout, benchmark.LAYOUTS, "layout")
    device = torch.device(args.device)
    if device.type == "cpu":
        precisions = ["ieee"]  # TF32 is a GPU mode
    setter = lambda value: torch.ops.conv2d_ext._set_option(args.switch, value)

    results = {}  # (shape, pass, precision, layout) -> {state: [records]}
    initial = setter(False)
    try:
        for r in range(args.rounds):
            for state in (False, True):
                setter(state)
                quiet = lambda s: print(f"[round {r + 1}, {args.switch}={int(state)}] {s}",
                                        file=sys.stderr, flush=True)
                for rec in benchmark.run(shapes, passes, precisions, device, args.quick, quiet,
                                         layouts=layouts):
                    key = (rec["shape"], rec["pass"], rec["precision"], rec["layout"])
                    results.setdefault(key, {False: [], True: []})[state].append(rec)
    finally:
        setter(initial)

    print(f"| shape | pass | prec | layout | ext ms, {args.switch} off | ext ms, on | on / off "
          f"| torch ms | err off | err on |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (shape, pass_, prec, layout), sides in results.items():
        off = [rec["ext_ms"] for rec in sides[False]]
        on = [rec["ext_ms"] for rec in sides[True]]
        torch_ms = [rec["torch_ms"] for rec in sides[False] + sides[True]]
        ratio = statistics.median(on) / statistics.median(off)
        print(f"| {shape} | {pass_} | {prec} | {layout} | {', '.join(f'{t:.3f}' for t in off)} "
              f"| {', '.join(f'{t:.3f}' for t in on)} | {ratio:.2f} "
              f"| {min(torch_ms):.3f}-{max(torch_ms):.3f} "
              f"| {max(rec['ext_rel_err'] for rec in sides[False]):.2e} "
              f"| {max(rec['ext_rel_err'] for rec in sides[True]):.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
