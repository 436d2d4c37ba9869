#!/usr/bin/env bash
# tqbench attn --backend cuda: its options, and what it does with and
# without a usable GPU.
#
# Everywhere:
#   1. --help documents --backend, --device and --batch; bad values and
#      options of the other backend exit 2 and say why;
# Without a usable GPU (as tqkvd --gpus finds it, or a build without CUDA):
#   2. tqbench attn --backend cuda --ctx 8192 exits 77 (skipped, for scripts)
#      with "no usable CUDA device: <why>" on stderr, the same reason as
#      tqkvd --gpus, and nothing on stdout (also with --json); tqbench ring
#      --backend cuda the same;
# With one: 3. a small run (ctx 8192, batch 1 and 2, no PyTorch baseline)
#   passes its checks: JSON lines, the device first, every decode case
#   within the kernels' contract of tq_attend_ref, the decode step in
#   one call (append, then attention) the same bits as two, the append's blocks
#   identical to tq_encode's; sparse-V skips; --phases is refused by
#   tqbench and read by tqbench-phases (every record in order).
. "$(dirname "$0")/lib/daemon.bash"
TQBENCH=$TQ_BIN/tqbench
[ -x "$TQBENCH" ] || { echo "tqbench not built"; exit 77; }

# 1. options
out=$("$TQBENCH" attn --help) || fail "attn --help exited $?"
for o in --backend --device --batch --no-baseline --check-max --phases 'exit status 77'; do
	grep -q -- "$o" <<<"$out" || fail "attn --help does not mention $o"
done
bad() { # expected message, then the arguments
	local want=$1 rc
	shift
	out=$("$TQBENCH" attn "$@" 2>&1); rc=$?
	[ "$rc" -eq 2 ] || fail "tqbench attn $*: exit $rc, not 2: $out"
	grep -qF -- "$want" <<<"$out" || fail "tqbench attn $*: no '$want' in: $out"
}
bad "--backend cpu|cuda, not gpu" --backend gpu
bad "--mode prefill is not an option of --backend cuda" --backend cuda --mode prefill
bad "--quality is not an option of --backend cuda" --backend cuda --quality
bad "--ctx 8192,x: a comma list" --backend cuda --ctx 8192,x
bad "--batch 0: a comma list" --backend cuda --batch 0
bad "--batch 1,999: a comma list" --backend cuda --batch 1,999
bad "--device x: not a count" --backend cuda --device x
bad "--batch needs --backend cuda" --batch 2
bad "a list of contexts needs --backend cuda" --ctx 8192,16384
bad "bad option value" --backend cuda --sparse 1.5
bad "--phases 0: calls in 1 .. 1000" --backend cuda --phases 0
bad "--phases needs --backend cuda" --phases 3

# 2. the device
gpus=
have_gpu=
if [ -x "$TQKVD" ]; then
	gpus=$("$TQKVD" --gpus 2>&1) && have_gpu=1 || have_gpu=0
	echo "tqkvd --gpus: $gpus"
fi
# (the same arguments run the small check on a GPU: the device comes first)
small=(--ctx 8192 --batch 1,2 --reps 5 --layers 4 --bulk 512 --no-baseline --json)
start=$EPOCHREALTIME
timeout 300 "$TQBENCH" attn --backend cuda "${small[@]}" >"$T/out" 2>"$T/err" </dev/null; rc=$?
if [ "$rc" -eq 77 ]; then
	[ "$have_gpu" = 1 ] && fail "tqkvd --gpus finds a GPU but tqbench skipped: $(cat "$T/err")"
	[ -s "$T/out" ] && fail "the skip printed on stdout: $(cat "$T/out")"
	# the plain command, with and without --json
	for json in "" --json; do
		"$TQBENCH" attn --backend cuda --ctx 8192 $json >"$T/out" 2>"$T/err" </dev/null; rc=$?
		echo "tqbench attn --backend cuda --ctx 8192 $json: exit $rc: $(cat "$T/err")"
		[ "$rc" -eq 77 ] || fail "without a GPU: exit $rc, not 77"
		grep -q '^tqbench attn: --backend cuda: no usable CUDA device: .' "$T/err" ||
			fail "the skip does not say why: $(cat "$T/err")"
		[ -s "$T/out" ] && fail "the skip printed on stdout: $(cat "$T/out")"
		case $gpus in
		"no usable CUDA device: "?*)
			grep -qF "${gpus#no usable CUDA device: }" "$T/err" ||
				fail "tqbench's reason differs from tqkvd --gpus': $(cat "$T/err") vs $gpus" ;;
		esac
	done
	# tqbench ring on a GPU pool: the same skip, tqkvd's reason
	"$TQBENCH" ring --backend cuda --iters 10 >"$T/out" 2>"$T/err" </dev/null; rc=$?
	[ "$rc" -eq 77 ] || fail "tqbench ring --backend cuda without a GPU: exit $rc, not 77: $(cat "$T/err")"
	grep -q '^tqbench ring: --backend cuda: no usable CUDA device: .' "$T/err" ||
		fail "tqbench ring's skip does not say why: $(cat "$T/err")"
	[ -s "$T/out" ] && fail "tqbench ring's skip printed on stdout: $(cat "$T/out")"
	"$TQBENCH" ring --backend gpu >/dev/null 2>&1; rc=$?
	[ "$rc" -eq 2 ] || fail "tqbench ring --backend gpu: exit $rc, not 2"
	dt=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
	echo "no usable GPU: tqbench attn and ring --backend cuda skip with the reason (exit 77, ${dt} s)"
	exit 0
fi
[ "$have_gpu" = 0 ] && fail "tqkvd --gpus finds no GPU but tqbench did not skip (exit $rc): $(cat "$T/err")"

# 3. a GPU: the small run's checks
[ "$rc" -eq 0 ] || fail "small GPU run: exit $rc: $(cat "$T/err")"
head -n 1 "$T/out" | grep -q '"mode":"device"' || fail "the device is not the first line: $(head -n 1 "$T/out")"
[ "$(grep -c '"mode":"decode"' "$T/out")" -eq 2 ] || fail "not two decode cases: $(cat "$T/out")"
[ "$(grep '"mode":"decode"' "$T/out" | grep -c '"check":"ok"')" -eq 2 ] ||
	fail "a decode check did not pass: $(cat "$T/out")"
# the decode step: the attention queued behind the append, the same bits
# as the two calls
[ "$(grep '"mode":"decode-step"' "$T/out" | grep '"fused":true' | grep -c '"check":"ok"')" -eq 1 ] ||
	fail "the decode step (one call) is missing, not queued or did not pass: $(cat "$T/out")"
[ "$(grep -c '"blocks_identical":true' "$T/out")" -eq 2 ] || fail "append blocks differ: $(cat "$T/out")"
if command -v python3 >/dev/null; then
	python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$T/out" ||
		fail "the output is not JSON lines: $(cat "$T/out")"
fi
cat "$T/out"
# sparse-V on sharp attention: timed after the exact call, values skipped,
# the output moved but little
timeout 300 "$TQBENCH" attn --backend cuda --ctx 32768 --batch 1 --reps 5 --layers 1 --bulk 64 --no-baseline \
	--check-max 8192 --sparse 0.01 --q-scale 16 --json >"$T/sv" 2>"$T/err" </dev/null ||
	fail "sparse-V run: exit $?: $(cat "$T/err")"
python3 -c '
import json, sys
c = [json.loads(l) for l in open(sys.argv[1]) if "decode-sparse" in l]
assert len(c) == 1, c
assert c[0]["skipped_share"] > 0 and c[0]["moved"] < 0.05, c[0]
print("sparse-V: %.1f %% of value chunks skipped, %.3f x the exact call, output moved %.2e" %
      (100 * c[0]["skipped_share"], c[0]["vs_exact"], c[0]["moved"]))' "$T/sv" ||
	fail "sparse-V run: $(cat "$T/sv")"
# the phase clocks: refused with the reason by tqbench (its kernels have
# none); tqbench-phases reads every CTA's record, in order
"$TQBENCH" attn --backend cuda --ctx 8192 --batch 1 --reps 2 --layers 1 --bulk 64 --no-baseline --phases 2 \
	>"$T/out" 2>"$T/err" </dev/null && fail "tqbench --phases passed without phase clocks"
grep -q "built without phase clocks" "$T/err" || fail "tqbench --phases: no reason: $(cat "$T/err")"
if [ -x "$TQ_BIN/tqbench-phases" ]; then
	timeout 300 "$TQ_BIN/tqbench-phases" attn --backend cuda --ctx 32768 --batch 1 --reps 2 --layers 1 --bulk 64 \
		--no-baseline --check-max 8192 --phases 5 --json >"$T/ph" 2>"$T/err" </dev/null ||
		fail "tqbench-phases: exit $?: $(cat "$T/err")"
	python3 -c '
import json, sys
c = [json.loads(l) for l in open(sys.argv[1]) if "\"phases\"" in l]
assert len(c) == 1, c
c = c[0]
assert c["out_of_order"] == 0 and c["ctas"] == c["grid"][0] * c["grid"][1] * c["grid"][2], c
assert 0 < c["loop_us"] < c["cta_max_us"] <= c["span_us"] and c["ns_per_cycle"] > 0, c
print("phases, 32k: span %.1f us, a CTA %.1f us (loop %.1f), %d CTAs on %d SMs" %
      (c["span_us"], c["cta_us"], c["loop_us"], c["ctas"], c["sms"]))' "$T/ph" ||
		fail "tqbench-phases: $(cat "$T/ph")"
fi
echo "GPU: tqbench attn --backend cuda ran and its checks passed"
