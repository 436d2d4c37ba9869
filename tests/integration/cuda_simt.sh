#!/usr/bin/env bash
# The GPU kernels' logic without a GPU: tests/unit/test_cuda.c on the SIMT
# emulator (tests/simt/: every CUDA thread a coroutine, warp collectives and
# barriers checked for convergence, a fake runtime whose device memory is
# guard-paged): the encoder's blocks byte-identical to the CPU reference,
# attention within 1e-3 of the oracle, every codec pair, split-K, causal
# prefill, errors and overflow.  TQ_CUDA_QUICK=1 trims the longest cases
# (fewer prefill queries, shorter split-K contexts) to keep `make test` short;
# run build/tests/simt/test_cuda_simt without it for the whole suite.
B=${TQ_BUILD:-$PWD/build}
# Sanitized builds leave CUDA out (Makefile), so a sanitizer pass would run
# make test's uninstrumented emulator again.
if [ -n "${SANITIZER:-}" ]; then
	echo "skipped: SANITIZER=$SANITIZER: the emulator is built only without sanitizers (make test runs it)"
	exit 77
fi
SIM=$B/tests/simt/test_cuda_simt
if [ ! -x "$SIM" ]; then
	echo "skipped: the SIMT emulator is built only in x86-64 builds with CUDA (make USE_CUDA=yes)"
	exit 77
fi
export LD_LIBRARY_PATH=$B/tests/simt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TQ_CUDA_QUICK=${TQ_CUDA_QUICK:-1}
"$SIM" || exit $?
# attn_mma's copy path of sm_80, sm_100 and sm_121 (cp.async in every lane;
# the first run took the bulk copies of sm_90): the cases that run the
# tiled kernel
TQ_TEST_SKIP=test_encode_args,test_encode_exact,test_encode_reg,test_encode_bound_ties,test_encode_errors,test_encode_long,test_attn_split_k,test_attn_waves \
	exec "$SIM"_cpasync
