#!/bin/sh
# The CUDA toolkit for building the GPU kernels, if there is none.
#
# /usr/local/cuda (or $CUDA_HOME) with nvcc: nothing to do.  Otherwise
# NVIDIA's own toolkit wheels from PyPI — nvcc, its front end (nvvm), the
# runtime, crt and cccl headers, pinned to one CUDA release — go into a
# venv under build/, and build/cuda points at them; the Makefile looks
# there next.  Nothing is downloaded from anywhere else.  When PyPI cannot
# be reached the build goes on without CUDA and says so (the GPU tier then
# answers "built without CUDA"); TQ_CUDA=no skips this step.
set -eu
cd "$(dirname "$0")/.."

[ "${TQ_CUDA:-}" = no ] && exit 0
for home in ${CUDA_HOME:-} /usr/local/cuda build/cuda; do
	[ -x "$home/bin/nvcc" ] && exit 0
done
home=/usr/local/cuda

# CUDA 13.0: compiles for sm_80 .. sm_121 (GB10); a driver >= 580 runs it
WHEELS="nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96
nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85"
venv=build/cuda-venv
mkdir -p build
echo "tqkvd: no CUDA toolkit at $home: installing NVIDIA's toolkit wheels from PyPI into $venv" >&2
if ! { [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"; } ||
   ! "$venv/bin/pip" install -q --disable-pip-version-check $WHEELS >&2; then
	echo "tqkvd: could not install the CUDA wheels (no python3-venv, or PyPI unreachable):" \
	     "building without the GPU kernels" >&2
	exit 0
fi
cu=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13 2>/dev/null | head -n 1)
if [ -z "$cu" ] || [ ! -x "$cu/bin/nvcc" ]; then
	echo "tqkvd: the CUDA wheels installed but $venv has no nvcc: building without the GPU kernels" >&2
	exit 0
fi
ln -sfn "$PWD/$cu" build/cuda
echo "tqkvd: CUDA toolkit: build/cuda -> $cu ($(build/cuda/bin/nvcc --version | tail -n 1))" >&2
