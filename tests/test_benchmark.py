"""The benchmark (conv2d_ext.benchmark): its record schema, the layout loop,
best-vs-best summaries, the ResNet-50 set, the models mode and the CLI. On
a CPU it runs the CPU path on reduced sizes, so all of this runs in CI."""
import builtins
import json
import time

import pytest
import torch

from conv2d_ext import benchmark

RECORD_KEYS = ("shape", "group", "pass", "precision", "layout", "ext_ms", "torch_ms", "speedup", "ext_tflops",
               "ext_rel_err", "torch_rel_err", "algo", "config")


def _run_cli(tmp_path, capsys, *args):
    out = tmp_path / "bench.json"
    assert benchmark.main(["--device", "cpu", "--quick", "--json", str(out), *args]) == 0
    return json.loads(out.read_text()), capsys.readouterr()


def test_cli_records_every_layout_and_a_summary(tmp_path, capsys):
    data, captured = _run_cli(tmp_path, capsys, "--shapes", "grouped_3x3,rgb_3x5")
    for key in ("device", "torch", "cuda", "cudnn", "commit", "date", "timing"):
        assert key in data
    records = data["records"]
    cases = {(r["shape"], r["pass"], r["layout"]) for r in records}
    assert cases == {(s, p, layout) for s in ("grouped_3x3", "rgb_3x5") for p in benchmark.PASSES
                     for layout in ("nchw", "channels_last")}
    assert len(records) == len(cases)  # the CPU runs one precision
    for r in records:
        for key in RECORD_KEYS:
            assert key in r, key
        assert r["ext_rel_err"] < 1e-5 and r["ext_ms"] > 0 and r["torch_ms"] > 0
        assert r["speedup"] == pytest.approx(r["torch_ms"] / r["ext_ms"])
        # Memory-bound shapes carry bandwidth fields, the others none.
        assert ("ext_gbps" in r) == (r["shape"] == "rgb_3x5")
        if r["shape"] == "rgb_3x5":
            assert r["copy_gbps"] > 0
        assert r["algo"]
    assert all(r["algo"].count("/") == 2 for r in records if r["pass"] == "step")
    summary = data["summary"]
    assert len(summary) == len(records) // 2
    for s in summary:
        pair = [r for r in records if (r["shape"], r["pass"], r["precision"]) ==
                (s["shape"], s["pass"], s["precision"])]
        assert s["ext_ms"] == min(r["ext_ms"] for r in pair)
        assert s["torch_ms"] == min(r["torch_ms"] for r in pair)
        assert s["speedup"] == pytest.approx(s["torch_ms"] / s["ext_ms"])
        assert s["ext_layout"] in ("nchw", "channels_last") and s["torch_layout"] in ("nchw", "channels_last")
    assert "ext layout" in captured.out and "torch layout" in captured.out


def test_channels_last_operands_reach_both_sides(monkeypatch):
    """The channels_last records hand channels_last tensors to both sides."""
    seen = {}

    def spy(name, make):
        def wrapped(pass_, shape, device="cpu"):
            fn = make(pass_, shape, device)

            def call(x, w, gy):
                if x.dtype == torch.float32:  # not the float64 reference
                    seen.setdefault(name, set()).add(x.is_contiguous(memory_format=torch.channels_last)
                                                     and not x.is_contiguous())
                return fn(x, w, gy)
            return call
        return wrapped

    monkeypatch.setattr(benchmark, "_ext_fn", spy("ext", benchmark._ext_fn))
    monkeypatch.setattr(benchmark, "_torch_fn", spy("torch", benchmark._torch_fn))
    benchmark.run(["grouped_3x3"], ["forward"], ["ieee"], torch.device("cpu"), quick=True,
                  progress=lambda s: None, layouts=["channels_last"])
    assert seen == {"ext": {True}, "torch": {True}}


def test_bf16_records_run_both_sides_in_bf16(monkeypatch):
    """A bf16 record hands bfloat16 operands to both sides, checks them
    against float64 on those values, and counts 2-byte elements."""
    seen = set()
    make = benchmark._ext_fn

    def spy(pass_, shape, device="cpu"):
        fn = make(pass_, shape, device)

        def call(x, w, gy):
            seen.add(x.dtype)
            return fn(x, w, gy)
        return call

    monkeypatch.setattr(benchmark, "_ext_fn", spy)
    (rec,) = benchmark.run(["dw_5x5"], ["forward"], ["bf16"], torch.device("cpu"), quick=True,
                           progress=lambda s: None, layouts=["nchw"])
    assert seen == {torch.bfloat16}
    assert rec["precision"] == "bf16"
    # bfloat16 results: an error of bfloat16's rounding, not float32's.
    assert 1e-4 < rec["ext_rel_err"] < 1e-2 and 1e-4 < rec["torch_rel_err"] < 1e-2
    shape = benchmark.SUITE["dw_5x5"].reduced()
    assert rec["min_bytes"] == benchmark.min_bytes(shape, "forward", 2)
    assert benchmark.min_bytes(shape, "forward", 2) * 2 == benchmark.min_bytes(shape, "forward")


def test_models_under_autocast_bf16():
    runs = {p: benchmark.run_models({"tiny": TinyNet}, [p], torch.device("cpu"), quick=True,
                                    progress=lambda s: None, layouts=["nchw"], size=16,
                                    classes=10)[0] for p in ("ieee", "bf16")}
    rec = runs["bf16"]
    assert rec["precision"] == "bf16"
    # Both under autocast: bfloat16 convolutions, losses within its rounding
    # of each other, and not float32's loss (same weights and inputs).
    assert rec["loss_rel_diff"] < 2e-2
    assert rec["torch_loss"] != runs["ieee"]["torch_loss"]
    assert rec["ext_loss"] != runs["ieee"]["ext_loss"]


def _fake(shape, pass_, layout, ext_ms, torch_ms, precision="tf32"):
    return {"shape": shape, "group": benchmark.GROUP_OF[shape], "pass": pass_, "precision": precision,
            "layout": layout, "ext_ms": ext_ms, "torch_ms": torch_ms, "speedup": torch_ms / ext_ms,
            "ext_tflops": 1.0, "torch_tflops": 1.0, "ext_rel_err": 1e-7, "torch_rel_err": 2e-7,
            "algo": f"algo-{layout}"}


def test_summary_is_best_against_best():
    records = [_fake("a", "forward", "nchw", 1.0, 4.0), _fake("a", "forward", "channels_last", 3.0, 2.0)]
    (s,) = benchmark.summarize(records)
    assert (s["ext_ms"], s["ext_layout"], s["algo"]) == (1.0, "nchw", "algo-nchw")
    assert (s["torch_ms"], s["torch_layout"]) == (2.0, "channels_last")
    assert s["speedup"] == pytest.approx(2.0)


def test_resnet50_totals_need_the_whole_set():
    names = list(benchmark.RESNET50)
    records = []
    for i, name in enumerate(names):
        records.append(_fake(name, "forward", "nchw", 1.0 + i, 2.0 + i))
        records.append(_fake(name, "forward", "channels_last", 2.0 + i, 1.0 + i))
    summary = benchmark.summarize(records)
    total = [s for s in summary if s["shape"] == "r50_total"]
    network = [s for s in summary if s["shape"] == "r50_network"]
    assert len(total) == len(network) == 1
    assert total[0]["ext_ms"] == pytest.approx(sum(1.0 + i for i in range(len(names))))
    assert total[0]["torch_ms"] == pytest.approx(sum(1.0 + i for i in range(len(names))))
    counts = benchmark.RESNET50_COUNTS
    assert network[0]["ext_ms"] == pytest.approx(sum(counts[n] * (1.0 + i) for i, n in enumerate(names)))
    assert total[0]["worst_speedup"] == pytest.approx(1.0)
    # The README's line sums the three passes; with only the forward here it has none.
    line = [r for r in benchmark.headline({"summary": summary}).splitlines() if "summed" in r][0]
    assert "| -" in line
    three = [dict(r, **{"pass": p}) for r in records for p in benchmark.PASSES[:3]]
    line = [r for r in benchmark.headline({"records": three}).splitlines() if "summed" in r][0]
    n = len(names)
    assert f"{3 * sum(1.0 + i for i in range(n)):.1f} ms" in line
    # One layer missing: no totals, rather than a sum over part of the set.
    partial = benchmark.summarize([r for r in records if r["shape"] != names[5]])
    assert not [s for s in partial if s["shape"].startswith("r50_t") or s["shape"] == "r50_network"]


def test_resnet50_set_is_the_networks_convolutions():
    shapes, counts = benchmark.RESNET50, benchmark.RESNET50_COUNTS
    assert len(shapes) == 23
    assert sum(counts.values()) == 53  # ResNet-50's convolution layers
    assert shapes["r50_3_64_224_k7s2"] == benchmark.Shape(32, 3, 64, 224, 224, (7, 7), (2, 2), (3, 3))
    assert shapes["r50_1024_2048_14_k1s2"].out_hw() == (7, 7)
    assert shapes["r50_512_512_14_k3s2"].out_hw() == (7, 7)
    tv = pytest.importorskip("torchvision")
    model = tv.models.resnet50(weights=None)
    found, x = set(), torch.zeros(1, 3, 224, 224)

    def record(m, inp, out):
        found.add((m.in_channels, m.out_channels, inp[0].shape[-1], m.kernel_size, m.stride, m.padding))

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model.eval()(x)
    for h in hooks:
        h.remove()
    ours = {(s.cin, s.cout, s.h, s.kernel, s.stride, s.padding) for s in shapes.values()}
    assert ours == found


def test_suite_selection():
    assert benchmark.select_shapes("seeds") == ["a", "b", "c"]
    assert benchmark.select_shapes("resnet50") == list(benchmark.RESNET50)
    assert benchmark.select_shapes("all") == list(benchmark.SUITE)
    assert benchmark.select_shapes("seeds,layers") == ["a", "b", "c", *benchmark.GROUPS["layers"]]
    assert benchmark.select_shapes("resnet50", "b,c") == ["b", "c"]
    with pytest.raises(SystemExit, match="unknown suite"):
        benchmark.select_shapes("nope")


def test_rejects_unknown_shape_and_layout():
    with pytest.raises(SystemExit, match="unknown shape"):
        benchmark.main(["--device", "cpu", "--shapes", "nope"])
    with pytest.raises(SystemExit, match="unknown layout"):
        benchmark.main(["--device", "cpu", "--shapes", "a", "--layout", "nhwc"])


def test_help_explains_every_option_and_lists_the_shapes(capsys):
    with pytest.raises(SystemExit):
        benchmark.main(["--help"])
    text = capsys.readouterr().out
    for needle in ("--passes", "dgrad", "--device", "cpu", "--layout", "--suite", "--models", "r50_3_64_224_k7s2",
                   "dw_5x5", "seeds: a, b, c", "convnext_tiny"):
        assert needle in text, needle


def test_cpu_header_names_no_gpu_libraries(tmp_path, capsys):
    data, captured = _run_cli(tmp_path, capsys, "--shapes", "grouped_3x3", "--passes", "forward",
                              "--layout", "nchw")
    header = [line for line in captured.err.splitlines() if line.startswith("# ")]
    assert len(header) == 1
    assert "cpu" in header[0] and "CUDA" not in header[0] and "cuDNN" not in header[0]
    assert data["cuda"] is None and data["cudnn"] is None and data["threads"] >= 1


class TinyNet(torch.nn.Sequential):
    def __init__(self, classes=10):
        super().__init__(
            torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.Conv2d(8, 16, 1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, classes))


def test_models_mode_with_a_tiny_model():
    records = benchmark.run_models({"tiny": TinyNet}, ["ieee"], torch.device("cpu"), quick=True,
                                   progress=lambda s: None, size=16, classes=10)
    assert [(r["model"], r["layout"]) for r in records] == [("tiny", "nchw"), ("tiny", "channels_last")]
    for r in records:
        for key in ("model", "batch", "precision", "layout", "ext_ms", "torch_ms", "speedup", "ext_peak_gib",
                    "torch_peak_gib"):
            assert key in r, key
        assert r["ext_ms"] > 0 and r["torch_ms"] > 0
        # The same weights and inputs through both: the same loss.
        assert r["loss_rel_diff"] < 1e-5
    (s,) = benchmark.summarize_models(records)
    assert s["ext_ms"] == min(r["ext_ms"] for r in records)
    assert s["torch_ms"] == min(r["torch_ms"] for r in records)


def test_models_mode_converts_a_copy_only():
    """The original keeps PyTorch's convolutions: convert() runs on a copy."""
    built = []

    def build():
        built.append(TinyNet())
        return built[-1]

    benchmark.run_models({"tiny": build}, ["ieee"], torch.device("cpu"), quick=True, progress=lambda s: None,
                         layouts=["nchw"], size=16, classes=10)
    assert all(type(m) is torch.nn.Conv2d for m in built[0].modules() if isinstance(m, torch.nn.Conv2d))


def test_models_without_torchvision_says_how_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_torchvision(name, *args, **kwargs):
        if name == "torchvision" or name.startswith("torchvision."):
            raise ImportError("No module named 'torchvision'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchvision)
    with pytest.raises(SystemExit, match="pip install torchvision"):
        benchmark.main(["--device", "cpu", "--models"])


def test_report_from_the_json_files(tmp_path, capsys):
    data, _ = _run_cli(tmp_path, capsys, "--shapes", "rgb_3x5", "--passes", "forward")
    models = {"device": "cpu (x86_64)", "torch": torch.__version__, "cuda": None, "cudnn": None, "threads": 2,
              "commit": "abc1234",
              "records": benchmark.run_models({"tiny": TinyNet}, ["ieee"], torch.device("cpu"), quick=True,
                                              progress=lambda s: None, size=16, classes=10)}
    (tmp_path / "models.json").write_text(json.dumps(models))
    assert benchmark.main(["--report", str(tmp_path / "bench.json"), "--models-json",
                           str(tmp_path / "models.json")]) == 0
    text = capsys.readouterr().out
    assert "## layers: best vs best" in text and "rgb_3x5" in text
    assert "## Models" in text and "tiny" in text
    assert "## Every record" in text
    assert benchmark.main(["--report", str(tmp_path / "bench.json"), "--models-json",
                           str(tmp_path / "models.json"), "--headline"]) == 0
    short = capsys.readouterr().out
    assert "memory-bound layers" in short and "rgb_3x5 fwd" in short and "whole models" in short
    assert "## Every record" not in short
    assert "bfloat16" not in short  # no 16-bit records, no 16-bit column


def test_headline_gains_a_column_per_16_bit_precision(capsys):
    summary = [dict(_fake("rgb_3x5", "forward", "nchw", 1.0, 2.0, precision=p),
                    ext_layout="nchw", torch_layout="nchw") for p in ("tf32", "ieee", "bf16")]
    short = benchmark.headline({"summary": summary})
    header = short.splitlines()[0]
    assert "TF32" in header and "IEEE" in header and "bfloat16" in header
    assert "float16 |" not in header.replace("bfloat16", "")
    assert "2.00-2.00x (lowest: rgb_3x5 fwd)" in short


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_timing_hides_the_host():
    """timing="gpu" counts the GPU's work only: a call that spends 3 ms on
    the host before a short kernel measures well under that, while
    timing="call" counts the host's 3 ms."""
    x = torch.randn(1 << 20, device="cuda")

    def slow_host(t):
        time.sleep(3e-3)
        return t * 2

    device = torch.device("cuda")
    gpu = benchmark.time_ms(slow_host, [(x,)], device, 1, 5, 10.0, timing="gpu")
    call = benchmark.time_ms(slow_host, [(x,)], device, 1, 5, 10.0, timing="call")
    assert call > 3.0
    assert gpu < 1.0


def test_resume_runs_only_what_the_file_lacks(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["--device", "cpu", "--quick", "--json", str(out), "--passes", "forward"]
    assert benchmark.main([*args, "--shapes", "grouped_3x3"]) == 0
    first = json.loads(out.read_text())
    # A partial shape (one of its records missing) is run again whole.
    partial = dict(first["records"][0], shape="rgb_3x5")
    first["records"].append(partial)
    out.write_text(json.dumps(first))
    ran = []
    real_run = benchmark.run
    benchmark_run = lambda shapes, *a, **k: ran.extend(shapes) or real_run(shapes, *a, **k)  # noqa: E731
    import unittest.mock
    with unittest.mock.patch.object(benchmark, "run", benchmark_run):
        assert benchmark.main([*args, "--shapes", "grouped_3x3,rgb_3x5,dw_5x5", "--resume"]) == 0
    assert ran == ["rgb_3x5", "dw_5x5"]
    data = json.loads(out.read_text())
    assert [r["shape"] for r in data["records"]] == ["grouped_3x3"] * 2 + ["rgb_3x5"] * 2 + ["dw_5x5"] * 2
    assert data["records"][:2] == first["records"][:2]
    assert data["resumed"] == 1 and data["date"] == first["date"]


def test_resume_refuses_another_commits_file(tmp_path, capsys, monkeypatch):
    out = tmp_path / "bench.json"
    args = ["--device", "cpu", "--quick", "--json", str(out), "--passes", "forward", "--layout", "nchw",
            "--shapes", "grouped_3x3"]
    monkeypatch.setenv("CONV2D_EXT_COMMIT", "aaaaaaa")
    assert benchmark.main(args) == 0
    monkeypatch.setenv("CONV2D_EXT_COMMIT", "bbbbbbb")
    with pytest.raises(SystemExit, match="commit 'aaaaaaa'"):
        benchmark.main([*args, "--resume"])
    assert not list(tmp_path.glob("*.tmp"))  # the file was written whole, then renamed


def test_report_reads_records_from_before_layouts(capsys):
    old = {k: v for k, v in _fake("a", "forward", "nchw", 1.0, 2.0).items() if k != "layout"}
    (s,) = benchmark.summarize([old])
    assert s["ext_layout"] == s["torch_layout"] == "nchw"
    assert "nchw" in benchmark.format_table([old])
