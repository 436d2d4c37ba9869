#!/bin/sh
# Cross-build kernels/ and its unit tests for aarch64 (the DGX Spark's CPU)
# and run them under qemu-user: the portable scalar paths, the NEON paths
# (codec bytes against the scalar reference, attention against the oracle),
# and the golden hashes that pin rotations, codebooks and encoded blocks to
# the same bits on every machine.  Fails when the tests report the NEON path
# untested (a build that lost it would otherwise pass on the scalar path).  Needs gcc-aarch64-linux-gnu and qemu-user-static
# (`apt-get install gcc-aarch64-linux-gnu qemu-user-static`, which the deps
# step installs); takes about 3 minutes under emulation.  `make test` runs it
# with TQ_AARCH64_QUICK=1 (tests/integration/aarch64.sh), which leaves out
# test_codec's long statistical cases (the paper's MSE figures, the same
# code on every machine) and test_attn's scalar path (TQ_TEST_ISAS=neon:
# the same C code the native run tests), and keeps every bit-exactness and
# golden case and every NEON attention case: about 85 s on a 2-core Zen 3
# (170 s before the scalar path was left out).
set -eu
cd "$(dirname "$0")/.."
CC=${CC_AARCH64:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-qemu-aarch64-static}
command -v "$CC" >/dev/null || { echo "check-aarch64: $CC not found (apt-get install gcc-aarch64-linux-gnu)" >&2; exit 77; }
command -v "$QEMU" >/dev/null || { echo "check-aarch64: $QEMU not found (apt-get install qemu-user-static)" >&2; exit 77; }
out=build/aarch64
mkdir -p "$out"
FLAGS="-std=gnu11 -O2 -Wall -Wextra -Wshadow -Wno-unused-parameter -Wvla -Werror -ffp-contract=off -D_GNU_SOURCE -pthread -Ikernels"
# compile two at a time, and (below) run the emulated tests side by side:
# qemu runs one test on one core
jobs=${TQ_AARCH64_JOBS:-2}
for f in $(ls kernels/*.c | grep -v "/tq_cuda\.c$") tests/unit/harness.c tests/unit/tietest.c; do
	echo "$f"
done | xargs -P "$jobs" -I{} sh -c '$0 $1 -c "$2" -o "$3/$(basename "$2" .c).o"' "$CC" "$FLAGS" {} "$out" ||
	{ echo "FAIL  the aarch64 build of kernels/"; exit 1; }
rm -f "$out/libk.a"
aarch64-linux-gnu-ar rcs "$out/libk.a" $(ls "$out"/*.o | grep -v "harness\|tietest")
if [ "${TQ_AARCH64_QUICK:-0}" = 1 ]; then
	# test_h16_scale: a property of the codebooks' FP16 tables (the same
	# code on every machine; the golden hashes pin the codebooks' bits), the
	# codebooks of 8 bits at d 512 built under emulation take most of a minute
	export TQ_TEST_SKIP=test_mse_paper_d128,test_mse_codebook_theory,test_codec_mse_norm_corrected,test_norm_preserved,test_rotation_orthogonal,test_h16_scale
	# test_attn's cases run the NEON path against the oracle, not the
	# scalar path too: that is the same C code the native run tests, and
	# emulating it took more than half of test_attn's time
	export TQ_TEST_ISAS=neon
fi
rc=0
tests="test_codec test_codec_simd test_attn test_xform"
for t in $tests; do
	$CC $FLAGS -Itests/unit -c "tests/unit/$t.c" -o "$out/$t.o"
	$CC -static -o "$out/$t" "$out/$t.o" "$out/harness.o" "$out/tietest.o" "$out/libk.a" -lm -pthread
done
# the longest first; at most $jobs at once.  test_codec_simd and test_attn
# run as two processes each (quick, under qemu on a Zen 3: test_codec_simd
# 34 + 30 s, test_attn 40 + 35 s, test_xform 4 s, test_codec 3 s) so that
# the two cores finish together; each part's log in $out/$t.N.log, its
# status in $out/$t.N.rc.  A part's TQ_TEST_SKIP adds to the quick run's.
rm -f "$out"/*.rc "$out"/*.log
simd_long=test_all_dims,test_encode_decode
attn_long=test_tile_decoders,test_all_pairs_d128,test_sparse_v
skip0=${TQ_TEST_SKIP:-}
printf '%s\n' "test_codec_simd 1 TQ_TEST_ONLY=$simd_long" "test_codec_simd 2 TQ_TEST_SKIP=$simd_long${skip0:+,$skip0}" \
	"test_attn 1 TQ_TEST_ONLY=$attn_long" "test_attn 2 TQ_TEST_SKIP=$attn_long${skip0:+,$skip0}" \
	"test_xform 1" "test_codec 1" |
	xargs -P "$jobs" -L 1 sh -c 't=$2 n=$3; [ -n "${4:-}" ] && export "$4"; "$0" "$1/$t" >"$1/$t.$n.log" 2>&1; echo $? >"$1/$t.$n.rc"' "$QEMU" "$out"
for t in $tests; do
	# one status and one log per test: a failure wins over a skip (77),
	# a skip over a pass
	st=0
	for n in 1 2; do
		[ -f "$out/$t.$n.rc" ] || continue
		r=$(cat "$out/$t.$n.rc")
		if [ "$r" != 0 ] && { [ "$st" = 0 ] || [ "$st" = 77 ]; }; then st=$r; fi
	done
	cat "$out/$t".[12].log >"$out/$t.log"
	echo "$st" >"$out/$t.rc"
	if [ "$st" = 0 ]; then
		echo "PASS  $t (aarch64, qemu)"
		case $t in
		test_codec_simd) want="^ *neon: tested" ;;
		test_attn) want="^best ISA: neon; attention paths tested:.* neon" ;;
		*) want= ;;
		esac
		if [ -n "$want" ]; then
			if line=$(grep -m1 "$want" "$out/$t.log"); then
				echo "      $t: $(echo "$line" | sed 's/^ *//')"
			else
				echo "FAIL  $t: the NEON path was not tested"; grep -m2 "tested" "$out/$t.log"; rc=1
			fi
		fi
	else
		st=$(cat "$out/$t.rc")
		if [ "$st" -eq 77 ]; then echo "SKIP  $t: $(tail -n 1 "$out/$t.log")"; else echo "FAIL  $t"; tail -n 20 "$out/$t.log"; rc=1; fi
	fi
done
exit $rc
