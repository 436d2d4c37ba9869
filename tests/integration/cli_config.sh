#!/usr/bin/env bash
# tqkvd's command line: --check-config (file:line errors), --version,
# --help, bad usage, start-up failures with clear messages.
. "$(dirname "$0")/lib/daemon.bash"

out=$("$TQKVD" --check-config 2>&1) || fail "--check-config on the defaults: $out"
grep -q '^pool.pool_bytes  *= 1GiB' <<<"$out" || fail "--check-config does not print the values: $out"
out=$("$TQKVD" --config "$TQ_SRC/config/tqkvd.conf" --check-config 2>&1) || fail "shipped config: $out"

printf '[daemon]\nmax_sessions = 0\n[pool]\npool_bytes = 12 parsecs\n' >"$T/bad.conf"
out=$("$TQKVD" --config "$T/bad.conf" --check-config 2>&1); rc=$?
[ "$rc" = 1 ] || fail "bad config: exit $rc"
grep -q "$T/bad.conf:2: daemon.max_sessions: 0 is out of range \[1, 65536\]" <<<"$out" || fail "no file:line: $out"
grep -q "$T/bad.conf:4: pool.pool_bytes: '12 parsecs' is not a size" <<<"$out" || fail "second error missing: $out"
out=$("$TQKVD" --config "$T/missing.conf" --check-config 2>&1); rc=$?
[ "$rc" = 1 ] && grep -q 'missing.conf: No such file' <<<"$out" || fail "missing file: $rc $out"

out=$("$TQKVD" --version) || fail "--version"
grep -q "^tqkvd $(cat "$TQ_SRC/VERSION")" <<<"$out" || fail "--version: $out"
out=$("$TQKVD" --help) || fail "--help"
grep -q -- '--check-config' <<<"$out" && grep -q 'SIGHUP' <<<"$out" || fail "--help: $out"
"$TQKVD" --frobnicate >/dev/null 2>&1; [ $? = 2 ] || fail "unknown option: not exit 2"
"$TQKVD" extra >/dev/null 2>&1; [ $? = 2 ] || fail "stray argument: not exit 2"
# --gpus, -V and -h act once the whole line parsed: bad usage after them is 2
"$TQKVD" --gpus --frobnicate >/dev/null 2>&1; [ $? = 2 ] || fail "--gpus then an unknown option: not exit 2"
"$TQKVD" -V extra >/dev/null 2>&1; [ $? = 2 ] || fail "-V then a stray argument: not exit 2"
"$TQKVD" -V -h | grep -q "^Usage" || fail "-V -h does not print the help"
"$TQKVD" -h --gpus | grep -q "^Usage" || fail "-h --gpus does not print the help"

# start-up failure: a bad config never binds anything
"$TQKVD" --config "$T/bad.conf" --run-dir "$T/run" >/dev/null 2>&1; [ $? = 1 ] || fail "bad config start: not exit 1"
[ -e "$T/run/control.sock" ] && fail "socket created despite a bad config"
# a spill directory that cannot be created
touch "$T/file"
out=$("$TQKVD" --run-dir "$T/run" --spill-dir "$T/file/spill" 2>&1); rc=$?
[ "$rc" = 1 ] && grep -q "spill directory $T/file/spill" <<<"$out" || fail "bad spill dir: $rc $out"
# plain (non-systemd) logs carry a timestamp
grep -q '^[0-9-]* [0-9:.]* err: spill directory' <<<"$out" || fail "plain log format: $out"
# a pool larger than the machine's available memory is refused, unless the
# operator says so explicitly (then it starts, with a warning)
avail_mib=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
printf '[pool]\npool_bytes = %dM\nspill_bytes = 64M\n' $((avail_mib + 2048)) >"$T/big.conf"
out=$(timeout 20 "$TQKVD" --config "$T/big.conf" --run-dir "$T/run" --spill-dir "$T/spill" 2>&1); rc=$?
[ "$rc" = 1 ] && grep -q "available (MemAvailable): lower pool_bytes, or set pool.allow_overcommit = yes" <<<"$out" \
	|| fail "a pool beyond MemAvailable: exit $rc: $out"
printf 'allow_overcommit = yes\n' >>"$T/big.conf"
start_daemon --config "$T/big.conf"
wait_up
grep -q "because pool.allow_overcommit = yes" "$LOG" || fail "no warning for an overcommitted pool"
stop_daemon
[ "$STOP_RC" = 0 ] || fail "overcommitted pool: exit $STOP_RC"
# ephemeral leaks are never permanent by default: idle sessions go after 1h
"$TQKVD" --check-config 2>&1 | grep -q '^daemon.session_idle_ttl *= 1h' || fail "session_idle_ttl default is not 1h"
echo ok
