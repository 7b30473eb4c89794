"""setup.py's choices without building anything: the CUDA toolkit and
runtime it finds, the architectures it builds, and that CI runs the
README's set-up and test commands as written."""
import importlib.util
import os
import re
import stat

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = os.path.join(ROOT, "setup.py")
if not os.path.exists(SETUP):
    pytest.skip("no setup.py beside the tests", allow_module_level=True)

spec = importlib.util.spec_from_file_location("conv2d_ext_setup", SETUP)
setup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup)  # defines the functions; setup() runs only as a script

CUDA13 = {"75", "80", "86", "87", "88", "89", "90", "100", "103", "110", "120", "121"}
CUDA12_8 = {"50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "89", "90", "100", "101", "120"}


def resolve(supported=CUDA13, capabilities=(), **environ):
    return setup.resolve_archs(environ, supported, list(capabilities))[0]


# --- architectures ---------------------------------------------------------


@pytest.mark.parametrize("supported", [CUDA13, CUDA12_8])
def test_default_without_gpu(supported):
    assert resolve(supported) == "8.0;9.0+PTX"


def test_default_builds_sm80_sm90a_and_compute90_ptx():
    assert setup.hopper_arch_flags(resolve()) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_90,code=compute_90",
    ]


def test_default_keeps_what_nvcc_supports():
    assert resolve({"75", "80", "86"}) == "8.0+PTX"


def test_wheel_archs_follow_nvcc():
    assert resolve(CUDA13, CONV2D_EXT_ARCHS="all") == "7.5;8.0;8.6;8.9;9.0+PTX"
    assert resolve(CUDA12_8, CONV2D_EXT_ARCHS="all") == "7.0;7.5;8.0;8.6;8.9;9.0+PTX"
    # A GPU on the wheel builder does not narrow the list.
    assert resolve(CUDA13, [(9, 0)], CONV2D_EXT_ARCHS="all") == "7.5;8.0;8.6;8.9;9.0+PTX"


def test_bad_archs_mode():
    with pytest.raises(SystemExit, match="CONV2D_EXT_ARCHS='some'"):
        resolve(CONV2D_EXT_ARCHS="some")


def test_visible_gpus():
    assert resolve(capabilities=[(9, 0)]) == "9.0"
    # An H100 gets its sm_90a kernels (torch's "native" would build sm_90).
    assert setup.hopper_arch_flags(resolve(capabilities=[(9, 0)])) == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert resolve(capabilities=[(9, 0), (8, 6), (9, 0)]) == "8.6;9.0"
    assert resolve(capabilities=[(9, 0)], TORCH_CUDA_ARCH_LIST="native") == "9.0"


def test_gpu_newer_than_nvcc_gets_ptx():
    assert resolve({"75", "80", "86", "89", "90"}, [(12, 0)]) == "9.0+PTX"


def test_explicit_list_wins_and_is_validated():
    assert resolve(capabilities=[(9, 0)], TORCH_CUDA_ARCH_LIST="8.6") == "8.6"
    assert resolve(TORCH_CUDA_ARCH_LIST="8.0 9.0a+PTX", CONV2D_EXT_ARCHS="all") == "8.0;9.0a+PTX"
    assert resolve(TORCH_CUDA_ARCH_LIST="Ampere;9.0") == "8.0;8.6+PTX;9.0"
    assert resolve(CUDA12_8, TORCH_CUDA_ARCH_LIST="7.0;7.5;8.0;8.6;8.9;9.0+PTX") == "7.0;7.5;8.0;8.6;8.9;9.0+PTX"


def test_explicit_list_unsupported_by_nvcc():
    with pytest.raises(SystemExit) as e:
        resolve(TORCH_CUDA_ARCH_LIST="7.0;7.5;8.0;8.6;8.9;9.0+PTX")
    message = str(e.value)
    assert "names 7.0," in message and "7.5, 8.0, 8.6" in message and "12.1" in message


@pytest.mark.parametrize("entry", ["sm_90", "9", "9.0+ptx"])
def test_explicit_list_malformed(entry):
    with pytest.raises(SystemExit, match=re.escape(entry)):
        resolve(TORCH_CUDA_ARCH_LIST=f"8.0;{entry}")


def test_native_without_gpu():
    with pytest.raises(SystemExit, match="no GPU is visible"):
        resolve(TORCH_CUDA_ARCH_LIST="native")


def test_unknown_nvcc_support_passes_lists_through():
    assert resolve(None) == "8.0;9.0+PTX"
    assert resolve(None, TORCH_CUDA_ARCH_LIST="7.0") == "7.0"


def executable(path, text="#!/bin/sh\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_nvcc_archs(tmp_path):
    nvcc = executable(tmp_path / "nvcc", "#!/bin/sh\nprintf 'compute_75\\ncompute_80\\ncompute_90\\n'\n")
    assert setup.nvcc_archs(str(nvcc)) == {"75", "80", "90"}
    assert setup.nvcc_archs(str(executable(tmp_path / "old", "#!/bin/sh\nexit 1\n"))) is None
    assert setup.nvcc_archs(str(tmp_path / "missing")) is None


# --- the toolkit and the runtime -------------------------------------------


def toolkit(root):
    executable(root / "bin" / "nvcc")
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("")
    return root


def find(tmp_path, **environ):
    return setup.find_cuda_home(environ, prefix=str(tmp_path / "usr_local"))


def test_wrapper_on_path_is_skipped(tmp_path):
    # A script in /usr/local/bin that execs the real nvcc: torch would take
    # /usr/local as the toolkit.
    local = tmp_path / "usr_local"
    executable(local / "bin" / "nvcc", f"#!/bin/sh\nexec {local}/cuda-13.0/bin/nvcc \"$@\"\n")
    toolkit(local / "cuda-13.0")
    (local / "cuda").symlink_to(local / "cuda-13.0")
    assert find(tmp_path, PATH=str(local / "bin")) == str(local / "cuda")


def test_newest_versioned_toolkit(tmp_path):
    local = tmp_path / "usr_local"
    for version in ("9.2", "12.8", "13.0"):
        toolkit(local / f"cuda-{version}")
    (local / "cuda-13.1").mkdir()  # incomplete: skipped
    assert find(tmp_path, PATH="") == str(local / "cuda-13.0")


def test_nvcc_on_path_first(tmp_path):
    toolkit(tmp_path / "opt" / "cuda-12.8")
    toolkit(tmp_path / "usr_local" / "cuda")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").symlink_to(tmp_path / "opt" / "cuda-12.8" / "bin" / "nvcc")
    assert find(tmp_path, PATH=str(tmp_path / "bin")) == str(tmp_path / "opt" / "cuda-12.8")


def test_no_toolkit_at_all(tmp_path):
    assert find(tmp_path, PATH="") is None


def test_nvcc_without_a_toolkit(tmp_path):
    executable(tmp_path / "bin" / "nvcc")
    with pytest.raises(SystemExit, match="Set CUDA_HOME"):
        find(tmp_path, PATH=str(tmp_path / "bin"))


def test_cuda_home_is_checked(tmp_path):
    root = toolkit(tmp_path / "cuda")
    assert find(tmp_path, CUDA_HOME=str(root), PATH="") == str(root)
    assert find(tmp_path, CUDA_PATH=str(root), PATH="") == str(root)
    executable(tmp_path / "bare" / "bin" / "nvcc")
    with pytest.raises(SystemExit, match="CUDA_HOME=.*bare is not a CUDA toolkit: it has no include/cuda_runtime.h"):
        find(tmp_path, CUDA_HOME=str(tmp_path / "bare"), CUDA_PATH=str(root), PATH="")


def test_cudart_from_the_toolkit(tmp_path):
    root = toolkit(tmp_path / "cuda")
    (root / "lib64").mkdir()
    (root / "lib64" / "libcudart.so").write_text("")
    assert setup.find_cudart(str(root), "13", []) == (str(root / "lib64"), None)


def test_cudart_from_torchs_nvidia_packages(tmp_path):
    root = toolkit(tmp_path / "cuda")
    lib = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13").write_text("")
    (tmp_path / "site" / "nvidia" / "cudnn" / "lib").mkdir(parents=True)
    assert setup.find_cudart(str(root), "13", [str(tmp_path / "site")]) == (str(lib), "libcudart.so.13")
    # Another CUDA major's runtime is not linked.
    with pytest.raises(SystemExit, match="no CUDA runtime to link against"):
        setup.find_cudart(str(root), "12", [str(tmp_path / "site")])


# --- CI runs what the README says ------------------------------------------


def readme_commands():
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("\n## Build from source and test\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_ci_runs_the_readme_commands_first():
    commands = readme_commands()
    assert commands[-1] == "python -m pytest tests -q"
    assert any('pip install --no-build-isolation -e ".[test]"' in c for c in commands)
    lines = open(os.path.join(ROOT, ".ci", "run")).read().splitlines()
    # Only comments, blank lines and `set` options before and between them.
    lines = [line for line in lines if line.strip() and not line.startswith("#")]
    while lines and lines[0].startswith("set "):
        lines.pop(0)
    assert lines[:len(commands)] == commands


def test_build_order_starts_the_longest_files_first():
    """Every source once; the listed long files that exist lead, the rest
    keep their order; every listed file exists (a renamed one would
    silently lose its place)."""
    root = os.path.dirname(SETUP)
    assert all(os.path.exists(os.path.join(root, f)) for f in setup.LONGEST_FIRST)
    sources = ["csrc/a.cpp", "csrc/cpu/blocked.cpp", "csrc/cuda/b.cu",
               "csrc/cuda/few_channels/wgrad.cu", "csrc/cuda/z.cu"]
    assert setup.build_order(sources) == [
        "csrc/cpu/blocked.cpp", "csrc/cuda/few_channels/wgrad.cu", "csrc/a.cpp",
        "csrc/cuda/b.cu", "csrc/cuda/z.cu"]
    assert setup.build_order(["csrc/a.cpp"]) == ["csrc/a.cpp"]


# --- instantiation files ---------------------------------------------------


def kernel_sizes(macro):
    """The (KH, KW) pairs of one of kernel_sizes.cuh's X-macro lists."""
    with open(os.path.join(ROOT, "csrc", "cuda", "kernel_sizes.cuh")) as f:
        text = f.read()
    body = re.search(r"#define " + macro + r"\(X\)((?:.*\\\n)*.*)", text).group(1)
    return [(int(h), int(w)) for h, w in re.findall(r"X\((\d+), (\d+)\)", body)]


@pytest.mark.parametrize("folder, prefix, macro, suffixes", [
    ("sm90", "fprop_flat", "CONV2D_EXT_FOR_EACH_KERNEL_SIZE", [""]),
    ("few_channels", "fprop", "CONV2D_EXT_FOR_EACH_FEW_CHANNELS_KERNEL_SIZE", [""]),
    ("few_channels", "dgrad", "CONV2D_EXT_FOR_EACH_FEW_CHANNELS_KERNEL_SIZE",
     ["_ci1", "_ci2", "_ci3", "_ci4"]),
])
def test_every_kernel_size_has_its_instantiation_files(folder, prefix, macro, suffixes):
    """A size on a list without its file would build and fail only at import
    (an undefined symbol); a file of a size off the list is dead code."""
    sizes = kernel_sizes(macro)
    assert sizes, macro
    names = [f"k{h}x{w}" for h, w in sizes] + ["generic"]
    wanted = {f"{prefix}_{name}{suffix}.cu" for name in names for suffix in suffixes}
    folder = os.path.join(ROOT, "csrc", "cuda", folder, "instantiations")
    present = {f for f in os.listdir(folder) if re.fullmatch(prefix + r"_(k\d+x\d+|generic)(_ci\d)?\.cu", f)}
    assert present == wanted


# --- one family at a time ----------------------------------------------------


def test_every_family_by_default():
    assert setup.select_families({}) == (setup.FAMILIES, [])
    assert setup.select_families({"CONV2D_EXT_FAMILIES": " "}) == (setup.FAMILIES, [])


def test_some_families_stub_out_the_rest():
    built, without = setup.select_families({"CONV2D_EXT_FAMILIES": "sm90, nhwc"})
    assert built == ("nhwc", "sm90")
    assert without == ["CONV2D_EXT_WITHOUT_DIRECT", "CONV2D_EXT_WITHOUT_FEW_CHANNELS",
                       "CONV2D_EXT_WITHOUT_IMPLICIT_GEMM"]
    sources = setup.cuda_sources(built)
    assert "csrc/cuda/fprop.cu" in sources and "csrc/cuda/without_families.cu" in sources
    assert any(f.startswith("csrc/cuda/sm90/instantiations/") for f in sources)
    assert any(f.startswith("csrc/cuda/nhwc/") for f in sources)
    assert not any(f.startswith(("csrc/cuda/direct/", "csrc/cuda/few_channels/",
                                 "csrc/cuda/implicit_gemm/")) for f in sources)


def test_every_cuda_file_belongs_to_a_family_or_to_every_build():
    """A folder of csrc/cuda that is not a family would be left out of every
    build; the full build's sources are every .cu file."""
    folders = {d for d in os.listdir(os.path.join(ROOT, "csrc", "cuda"))
               if os.path.isdir(os.path.join(ROOT, "csrc", "cuda", d))}
    assert folders == set(setup.FAMILIES)
    every = {os.path.relpath(os.path.join(dirpath, f), ROOT)
             for dirpath, _, files in os.walk(os.path.join(ROOT, "csrc", "cuda"))
             for f in files if f.endswith(".cu")}
    assert set(setup.cuda_sources(setup.FAMILIES)) == every


def test_the_families_header_is_rewritten_only_when_it_changes(tmp_path):
    """The stubs' macros live in a header only without_families.cu reads:
    the same families leave it untouched (ninja then rebuilds nothing),
    others rewrite it."""
    (tmp_path / "csrc" / "cuda").mkdir(parents=True)
    header = tmp_path / setup.FAMILIES_HEADER
    setup.write_families_header(["CONV2D_EXT_WITHOUT_SM90"], root=str(tmp_path))
    assert "#define CONV2D_EXT_WITHOUT_SM90\n" in header.read_text()
    os.utime(header, (1, 1))
    setup.write_families_header(["CONV2D_EXT_WITHOUT_SM90"], root=str(tmp_path))
    assert header.stat().st_mtime == 1
    setup.write_families_header([], root=str(tmp_path))
    assert "#define" not in header.read_text() and header.stat().st_mtime > 1


def test_an_unknown_family_is_refused_with_the_list():
    with pytest.raises(SystemExit, match="unknown sm100; the families are direct, few_channels"):
        setup.select_families({"CONV2D_EXT_FAMILIES": "nhwc,sm100"})


def test_without_families_has_a_guard_per_family():
    """Each family's stubs (without_families.cu) sit under its guard; the
    guards are the flags select_families gives."""
    with open(os.path.join(ROOT, "csrc", "cuda", "without_families.cu")) as f:
        text = f.read()
    guards = re.findall(r"#ifdef CONV2D_EXT_WITHOUT_(\w+)", text)
    assert guards == [f.upper() for f in setup.FAMILIES]
