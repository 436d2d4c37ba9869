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
# the emulator's own checks first: one that no longer fired would let the
# suite pass kernels that hang or read garbage on a GPU
"$B/tests/simt/simt_selftest" || { echo "FAIL: the SIMT emulator's self-test"; exit 1; }
export LD_LIBRARY_PATH=$B/tests/simt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TQ_CUDA_QUICK=${TQ_CUDA_QUICK:-1}
# Three runs of one thread each, side by side (each into its own log,
# printed whole in turn): the longest attention cases, then the rest, of
# the build with sm_90's bulk copies; and attn_mma's copy path of sm_80,
# sm_100 and sm_121 (cp.async in every lane) on the cases that run the
# tiled kernel.
long=test_attn_pairs,test_attn_split_k,test_attn_waves
log=$(mktemp -d "${TMPDIR:-/tmp}/cuda_simt.XXXXXX") || exit 1
pids=
trap 'kill $pids 2>/dev/null; rm -rf "$log"' EXIT
TQ_TEST_ONLY=$long "$SIM" >"$log/1" 2>&1 &
pids="$pids $!"
TQ_TEST_SKIP=$long "$SIM" >"$log/2" 2>&1 &
pids="$pids $!"
TQ_TEST_SKIP=test_encode_args,test_encode_exact,test_encode_reg,test_encode_bound_ties,test_encode_errors,test_encode_long,test_attn_split_k,test_attn_waves \
	"$SIM"_cpasync >"$log/3" 2>&1 &
pids="$pids $!"
rc=0
n=0
for p in $pids; do
	n=$((n + 1))
	wait "$p"
	r=$?
	case $n in
	1) what="test_cuda_simt, bulk copies: $long" ;;
	2) what="test_cuda_simt, bulk copies: the other cases" ;;
	*) what="test_cuda_simt_cpasync, cp.async" ;;
	esac
	echo "== $what: exit $r"
	cat "$log/$n"
	# a failure wins over a skip (77), a skip over a pass
	if [ $r -ne 0 ] && { [ $rc -eq 0 ] || [ $rc -eq 77 ]; }; then rc=$r; fi
done
pids=
exit $rc
