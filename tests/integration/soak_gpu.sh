#!/usr/bin/env bash
# The chaos soak on a GPU pool, without a GPU: tqkvd-simt (tqkvd whose GPU
# pool is the SIMT emulator's: the real tq_cuda.c and backend_cuda.c, the
# kernels' device code on the CPU) under tests/soak/soak.sh for
# SOAK_SECONDS (default 20) with SOAK_CLIENTS (default 2) clients, outputs
# held to the GPU kernels' contract.  It found that a persistent session
# could be dropped at a restart (ARCHITECTURE.md §5b, Recovery).  Skipped
# where the emulator is not built (aarch64, sanitizer builds, no CUDA).
SIMT_TQKVD=${TQ_BUILD:-$PWD/build}/tests/simt/tqkvd-simt
if [ ! -x "$SIMT_TQKVD" ] || [ -n "${SANITIZER:-}" ]; then
	echo "the emulator's tqkvd (tests/simt/tqkvd-simt) is not built here (x86-64 with CUDA, no sanitizer)"
	exit 77
fi
export LD_LIBRARY_PATH=$(dirname "$SIMT_TQKVD")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TQKVD=$SIMT_TQKVD TQ_POOL_BACKEND=cuda
export SOAK_SECONDS=${SOAK_SECONDS:-20} SOAK_CLIENTS=${SOAK_CLIENTS:-2}
exec bash "$(dirname "$0")/../soak/soak.sh"
