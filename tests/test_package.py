"""Package-level behaviour: version, build info, import diagnostics, the A/B
script (the benchmark: test_benchmark.py)."""
import importlib.util
import json
import pathlib
import time
import warnings

import pytest
import torch

import conv2d_ext
from conv2d_ext import _loader, benchmark


def test_version_and_build_info():
    info = conv2d_ext.build_info()
    assert info["version"] == conv2d_ext.__version__
    assert info["torch"] is not None  # written by setup.py at build time
    assert (info["cuda"] is None) == (info["cuda_archs"] is None)


def test_import_failure_names_both_versions(monkeypatch):
    def fail(name, package=None):
        raise ImportError("_C.abi3.so: undefined symbol: _ZN3c104impl3cow11cow_deleterEPv")

    monkeypatch.setattr(_loader.importlib, "import_module", fail)
    monkeypatch.setattr(_loader, "build_info", lambda: {
        "version": "0.1.0", "torch": "2.9.0+cu128", "cuda": "12.8", "cuda_archs": "9.0"})
    with pytest.raises(ImportError) as excinfo:
        _loader.load_library()
    message = str(excinfo.value)
    assert "built for torch 2.9.0+cu128 (CUDA 12.8)" in message
    assert f"runs torch {torch.__version__}" in message
    assert "undefined symbol" in message


def test_a_partial_build_warns_on_import(monkeypatch):
    """A build of some kernel families only (CONV2D_EXT_FAMILIES) says so on
    import; a full build does not."""
    monkeypatch.setattr(_loader.importlib, "import_module", lambda name, package=None: None)
    info = {"version": "0.1.0", "torch": torch.__version__, "cuda": "13.0", "cuda_archs": "9.0a",
            "cuda_families": ["nhwc"]}
    monkeypatch.setattr(_loader, "build_info", lambda: info)
    with pytest.warns(UserWarning, match=r"families nhwc only \(CONV2D_EXT_FAMILIES\)"):
        _loader.load_library()
    info["cuda_families"] = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _loader.load_library()


def test_ab_switch_script_restores_the_switch(capsys):
    """scripts/ab_switch.py (an A/B of a test switch in one build) runs both
    sides, prints them side by side and leaves the switch as it found it."""
    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "ab_switch.py"
    spec = importlib.util.spec_from_file_location("ab_switch", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ops = torch.ops.conv2d_ext
    before = ops._set_option("few_channels_wgrad_sm90", True)
    try:
        script.main(["few_channels_wgrad_sm90", "--device", "cpu", "--shapes", "rgb_3x5",
                     "--passes", "backward_weight", "--rounds", "1", "--quick"])
        assert ops._set_option("few_channels_wgrad_sm90", True) is True, "the switch was not restored"
    finally:
        ops._set_option("few_channels_wgrad_sm90", before)
    table = capsys.readouterr().out
    prefix = "| rgb_3x5 | backward_weight | ieee |"
    row = [line for line in table.splitlines() if line.startswith(prefix)]
    assert len(row) == 1, table
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    assert cells[3] == "nchw"
    assert float(cells[4]) > 0 and float(cells[5]) > 0
    assert float(cells[8]) < 1e-5 and float(cells[9]) < 1e-5
