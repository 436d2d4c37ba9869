#!/usr/bin/env bash
# bench-run-daemon.sh — generation through tqkvd against the same codecs
# in-process (issue 13's target: daemon >= 0.9 x local tokens/s, single
# client), measured in the same run.
#
# Starts a private tqkvd, then runs `tqkv-run generate` on SmolLM2-135M
# (scripts/get-models.sh) ROUNDS times each way, interleaved (local, daemon,
# local, ...), the same prompt, seed, codecs and steps, and prints each
# run's generation tokens/s, the medians and their ratio.  Run it on an
# otherwise idle machine.
#
#   scripts/bench-run-daemon.sh [ROUNDS] [STEPS]      (defaults 3, 128)
# Environment: K, V (codecs, default q8/tq4), BIN (default build/bin).
set -u
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-128}
K=${K:-q8}
V=${V:-tq4}
BIN=${BIN:-build/bin}
M=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
die() { echo "bench-run-daemon: $*" >&2; exit 1; }

[ -r "$M" ] || scripts/get-models.sh >/dev/null || die "the model could not be fetched"
for b in tqkvd tqkv-run; do [ -x "$BIN/$b" ] || die "$BIN/$b is not built: run make"; done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-run.XXXXXX") || die "mktemp"
pid=
cleanup() {
	[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
"$BIN/tqkvd" --run-dir "$tmp/run" --spill-dir "$tmp/spill" >"$tmp/log" 2>&1 &
pid=$!
for _ in $(seq 100); do
	[ -S "$tmp/run/data.sock" ] && break
	kill -0 "$pid" 2>/dev/null || { cat "$tmp/log" >&2; die "tqkvd exited"; }
	sleep 0.1
done
[ -S "$tmp/run/data.sock" ] || die "tqkvd did not start"

GEN=(generate --model "$M" --prompt "Once upon a time, in a small village by the sea, there lived" --temperature 0
	--steps "$STEPS" --ctx 512 --k "$K" --v "$V")
rate() { sed -n 's/.*generated: [0-9]* tokens at \([0-9.]*\) tokens\/s.*/\1/p' "$1"; }
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
isa=$(grep -qw avx512f /proc/cpuinfo && echo "AVX-512" || (grep -qw avx2 /proc/cpuinfo && echo "AVX2") || uname -m)
echo "SmolLM2-135M, K $K / V $V, $STEPS generated tokens, $ROUNDS rounds; cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')${isa:+; $isa}"
: >"$tmp/l"; : >"$tmp/d"
for r in $(seq "$ROUNDS"); do
	"$BIN/tqkv-run" "${GEN[@]}" --local >"$tmp/out" 2>&1 || die "local run failed: $(tail -n 3 "$tmp/out")"
	a=$(rate "$tmp/out"); echo "$a" >>"$tmp/l"
	"$BIN/tqkv-run" "${GEN[@]}" --run-dir "$tmp/run" >"$tmp/out" 2>&1 || die "daemon run failed: $(tail -n 3 "$tmp/out")"
	b=$(rate "$tmp/out"); echo "$b" >>"$tmp/d"
	echo "round $r: local $a tokens/s, tqkvd $b tokens/s"
done
ml=$(median <"$tmp/l"); md=$(median <"$tmp/d")
awk -v l="$ml" -v d="$md" 'BEGIN { printf "median: local %.1f tokens/s, tqkvd %.1f tokens/s, tqkvd/local %.3f (target >= 0.9)\n", l, d, d / l }'
