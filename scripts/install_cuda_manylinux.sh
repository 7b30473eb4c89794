#!/usr/bin/env bash
# cibuildwheel before-all on a manylinux_2_28 (AlmaLinux 8) image: install the
# CUDA compiler and the headers ATen's CUDA headers include, for the CUDA
# version in CONV2D_EXT_CUDA (major-minor, e.g. 13-0 or 12-8).
set -euo pipefail
version=${CONV2D_EXT_CUDA:?set CONV2D_EXT_CUDA, e.g. 13-0}
dnf install -y dnf-plugins-core
dnf config-manager --add-repo https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo
dnf install -y "cuda-nvcc-$version" "cuda-cudart-devel-$version" "cuda-nvrtc-devel-$version" \
  "libcublas-devel-$version" "libcusparse-devel-$version" "libcusolver-devel-$version" \
  "libcurand-devel-$version" "cuda-nvtx-$version" "cuda-profiler-api-$version"
ln -sfn "/usr/local/cuda-${version/-/.}" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version
