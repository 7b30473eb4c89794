"""Loads the compiled module and explains a mismatch when it cannot."""
import importlib
import warnings

import torch

from .version import __version__


def build_info():
    """What the binary module was built against: torch, CUDA, GPU archs;
    cuda_families: the CUDA kernel families built, None for all of them
    (setup.py's CONV2D_EXT_FAMILIES)."""
    try:
        from . import _build_info as b
    except ImportError:  # running from a checkout that was never built
        return {"version": __version__, "torch": None, "cuda": None, "cuda_archs": None,
                "cuda_families": None}
    return {
        "version": __version__,
        "torch": b.TORCH_VERSION,
        "cuda": b.CUDA_VERSION,
        "cuda_archs": b.CUDA_ARCHS,
        "cuda_families": getattr(b, "CUDA_FAMILIES", None),
    }


def _minor(version):
    return ".".join(str(version).split("+")[0].split(".")[:2])


def load_library():
    info = build_info()
    running = f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    built = f"torch {info['torch']} (CUDA {info['cuda']})"
    try:
        importlib.import_module("._C", __package__)
    except ImportError as e:
        if info["torch"] is None:
            hint = "the package has not been built: run `pip install --no-build-isolation .`"
        else:
            hint = (
                f"it was built for {built} and this process runs {running}; "
                f"install a conv2d_ext built for torch {_minor(torch.__version__)}, "
                "or rebuild it with `pip install --no-build-isolation --force-reinstall .`"
            )
        raise ImportError(f"conv2d_ext {__version__}: cannot load its compiled module: {hint}. ({e})") from e
    if info["torch"] is not None and _minor(info["torch"]) != _minor(torch.__version__):
        warnings.warn(f"conv2d_ext was built for {built} but runs with {running}; rebuild it if ops misbehave")
    if info.get("cuda_families"):
        warnings.warn(f"conv2d_ext was built with the CUDA kernel families {', '.join(info['cuda_families'])} "
                      "only (CONV2D_EXT_FAMILIES): calls whose plan picks another family raise")
