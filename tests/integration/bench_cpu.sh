#!/usr/bin/env bash
# tqbench's CPU suites still run and say what they measured (a smoke test,
# not a timing: the figures are BENCHMARKS.md's):
#   1. tqbench kern on every ISA this CPU has: the ISA in its first line, a
#      row per codec with positive times, the two pairs against f16; --json
#      gives one parseable line per codec; an ISA the CPU lacks exits 1 and
#      says so; bad options exit 2;
#   2. tqbench attn --q-scale with mass-bounded sparse-V: a small run prints
#      its fused time and marks sparse-V; an out-of-range --q-scale exits 2;
#   3. tqbench attn --resident N: the header says how many pages stay, and
#      the fused output still matches the exact one (every cache, the fp32
#      oracle's too, cycles over the same pages); a count below 1 exits 2.
. "$(dirname "$0")/lib/daemon.bash"
TQBENCH=$TQ_BIN/tqbench
[ -x "$TQBENCH" ] || { echo "tqbench not built"; exit 77; }

# the first line of a run's output, less a sanitizer build's warning
# (SANITIZER=... make check runs this on the sanitized tqbench)
first() { grep -v '^tqbench: WARNING: this is a SANITIZER=' | head -n 1; }
if [ -n "${SANITIZER:-}" ]; then
	"$TQBENCH" kern --isa scalar --reps 1 2>&1 >/dev/null | grep -q "^tqbench: WARNING: this is a SANITIZER=$SANITIZER build" ||
		fail "a SANITIZER=$SANITIZER build of tqbench does not warn that its timings mean nothing"
fi

ran=0
for isa in scalar avx2 avx512 neon; do
	out=$("$TQBENCH" kern --isa "$isa" --reps 1 2>&1); rc=$?
	if [ "$rc" -eq 1 ]; then
		grep -q "isa $isa not available here" <<<"$out" || fail "kern --isa $isa: exit 1 without saying why: $out"
		continue
	fi
	[ "$rc" -eq 0 ] || fail "kern --isa $isa: exit $rc: $out"
	first <<<"$out" | grep -Eq "isa $isa(\+[a-z]+)? " || fail "kern --isa $isa: the first line does not name the ISA: $out"
	for c in tq4 tq3 tq2 q8 f16 tq4o tq3o; do
		grep -Eq "^  $c +[0-9.]+ +[0-9.]+ +[0-9.]+ +as K and V: [0-9.]+ ns, [0-9.]+ x f16$" <<<"$out" ||
			fail "kern --isa $isa: no row for $c: $out"
	done
	grep -Eq "^  K tq4 / V tq3: [0-9.]+ ns, [0-9.]+ x f16;  K q8 / V tq4: [0-9.]+ ns, [0-9.]+ x f16$" <<<"$out" ||
		fail "kern --isa $isa: no pair line: $out"
	ran=$((ran + 1))
done
[ "$ran" -ge 1 ] || fail "tqbench kern ran on no ISA (scalar is always there)"

out=$("$TQBENCH" kern --json --reps 1) || fail "kern --json exited $?"
python3 - "$out" <<'EOF' || fail "kern --json: $out"
import json, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines()]
assert [r["codec"] for r in rows] == ["tq4", "tq3", "tq2", "q8", "f16", "tq4o", "tq3o"], rows
for r in rows:
    assert r["suite"] == "kern" and r["dim"] == 128 and r["isa"], r
    assert r["scores_ns"] > 0 and r["softmax_ns"] > 0 and r["accum_ns"] > 0 and r["f16_total_ns"] > 0, r
EOF

bad() { # suite, expected message, then the arguments
	local suite=$1 want=$2 rc
	shift 2
	out=$("$TQBENCH" "$suite" "$@" 2>&1); rc=$?
	[ "$rc" -eq 2 ] || fail "tqbench $suite $*: exit $rc, not 2: $out"
	grep -qF -- "$want" <<<"$out" || fail "tqbench $suite $*: no '$want' in: $out"
}
bad kern "unknown isa foo" --isa foo
bad kern "--reps wants 1..100000" --reps 0
bad kern "unknown option --ctx" --ctx 8
bad attn "--q-scale wants (0, 64]" --q-scale 0
bad attn "--q-scale wants (0, 64]" --q-scale 65
bad attn "--resident wants a page count >= 1" --resident 0
bad attn "--resident wants a page count >= 1" --resident 2x

out=$("$TQBENCH" attn --ctx 1024 --reps 1 --threads 1 --q-scale 8 --sparse 0.01 2>&1) || fail "attn --q-scale 8 --sparse 0.01: $out"
first <<<"$out" | grep -q "sparse-V on" || fail "attn --sparse: not marked in the first line: $out"
grep -Eq "^  fused +[0-9.]+ ms" <<<"$out" || fail "attn --q-scale: no fused time: $out"
out=$("$TQBENCH" attn --ctx 2048 --reps 1 --threads 1 --resident 2 2>&1) || fail "attn --resident 2: $out"
first <<<"$out" | grep -Eq "resident: 2 of 8 pages \([0-9.]+ MB; fp16 [0-9.]+ MB\)" ||
	fail "attn --resident: not in the first line: $out"
cs=$(sed -n 's/.*cos vs exact \([0-9.]*\).*/\1/p' <<<"$out")
awk -v c="$cs" 'BEGIN { exit !(c > 0.95) }' || fail "attn --resident: cos vs exact '$cs' (the oracle did not cycle alike?): $out"
echo "tqbench kern ran on $ran ISA(s); attn --q-scale with sparse-V and --resident ran"
