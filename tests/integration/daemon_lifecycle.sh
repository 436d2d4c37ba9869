#!/usr/bin/env bash
# Readiness through our own NOTIFY_SOCKET, STATUS=, SIGHUP reload changing a
# tenant budget (RELOADING=1 then READY=1), journal-style log prefixes, and
# SIGTERM: STOPPING=1 and exit 0 within 2 s.
. "$(dirname "$0")/lib/daemon.bash"
command -v python3 >/dev/null || { echo "python3 missing (notify listener)"; exit 77; }

cat >"$T/tqkvd.conf" <<CONF
[pool]
pool_bytes = 256M
[tenant prod]
limit = 128M
guaranteed = 64M
allow_uids = *
CONF

notify_listen
NOTIFY_SOCKET=$T/notify.sock start_daemon --config "$T/tqkvd.conf"
wait_for '^READY=1' "$NOTIFY_LOG"
# READY=1 promises the control socket accepts calls: no retry here
ctl health >/dev/null || fail "READY=1 was sent before the control socket answered"
grep -q '^STATUS=0 sessions open' "$NOTIFY_LOG" || fail "no STATUS= line with READY=1"
# under systemd (NOTIFY_SOCKET set) log lines carry syslog priorities
grep -q '^<5>tqkvd .* ready' "$LOG" || fail "no '<5>' journal prefix in the log"

limit() { ctl tenants --json | python3 -c 'import json,sys; print([t["limit_bytes"] for t in json.load(sys.stdin)["tenants"] if t["name"]=="prod"][0])'; }
[ "$(limit)" = $((128 << 20)) ] || fail "initial limit is $(limit)"

# a runtime change, then a reload from the edited file
ctl budget set prod --limit 100M >/dev/null || fail "budget set"
[ "$(limit)" = $((100 << 20)) ] || fail "budget set did not apply"
sed -i 's/^limit = 128M/limit = 192M/' "$T/tqkvd.conf"
: >"$NOTIFY_LOG"
kill -HUP "$DAEMON_PID"
wait_for '^READY=1' "$NOTIFY_LOG"
awk '/^RELOADING=1/{r=NR} /^READY=1/{if (r && NR > r) ok=1} END{exit !ok}' "$NOTIFY_LOG" \
	|| fail "expected RELOADING=1 then READY=1, got: $(tr '\n' ' ' <"$NOTIFY_LOG")"
grep -q '^MONOTONIC_USEC=' "$NOTIFY_LOG" || fail "RELOADING=1 without MONOTONIC_USEC"
[ "$(limit)" = $((192 << 20)) ] || fail "reload did not change the limit: $(limit)"
grep -q 'reload: tenant.prod.limit: 128MiB -> 192MiB' "$LOG" || fail "the reload does not say what it changed"
[ "$(ctl stats --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["reloads_total"])')" = 1 ] \
	|| fail "reloads_total"
# a run-time budget, then a reload of the same file: put back, and said
# (it was silent: "0 options changed")
ctl budget set prod --limit 150M >/dev/null || fail "budget set"
: >"$NOTIFY_LOG"
kill -HUP "$DAEMON_PID"
wait_for '^READY=1' "$NOTIFY_LOG"
[ "$(limit)" = $((192 << 20)) ] || fail "the reload did not put the file's limit back: $(limit)"
grep -q 'reload: tenant.prod.limit: 150MiB (set at run time) -> 192MiB (the file.s)' "$LOG" ||
	fail "the reload does not say it put the file's budget back: $(grep reload: "$LOG" | tail -3)"
grep -q 'reload: done, 1 option changed' "$LOG" || fail "the put-back budget is not counted"

# a broken file: the reload is refused, the daemon keeps running as it was
echo "pool_bytes = lots" >>"$T/tqkvd.conf"
: >"$NOTIFY_LOG"
kill -HUP "$DAEMON_PID"
wait_for '^READY=1' "$NOTIFY_LOG"
grep -q "tqkvd.conf:7: unknown option 'pool_bytes'" "$LOG" || fail "reload error does not name file:line"
grep -q 'keeping the running configuration' "$LOG" || fail "bad reload not reported"
[ "$(limit)" = $((192 << 20)) ] || fail "a bad reload changed the limit"

# a bigger pool staged in the file for the next restart: said, not applied,
# and it does not block what does reload (a tenant without a limit has the
# running pool's, not the file's: the reload was refused as "limit larger
# than the pool")
cat >"$T/tqkvd.conf" <<CONF
[daemon]
log_level = debug
[pool]
pool_bytes = 1G
[tenant prod]
guaranteed = 64M
allow_uids = *
CONF
: >"$NOTIFY_LOG"
kill -HUP "$DAEMON_PID"
wait_for '^READY=1' "$NOTIFY_LOG"
grep -q 'reload: pool.pool_bytes changed in the file; it takes effect after a restart' "$LOG" \
	|| fail "the staged pool_bytes was not reported"
grep -q 'reload: daemon.log_level: info -> debug' "$LOG" || fail "the reload with a staged pool_bytes: $(grep reload: "$LOG" | tail -4)"
[ "$(limit)" = $((256 << 20)) ] || fail "the unset limit is $(limit), not the running pool's 256 MiB"

: >"$NOTIFY_LOG"
stop_daemon TERM
[ "$STOP_RC" = 0 ] || fail "SIGTERM: exit $STOP_RC"
[ "$STOP_MS" -lt 2000 ] || fail "SIGTERM took $STOP_MS ms"
grep -q '^STOPPING=1' "$NOTIFY_LOG" || fail "no STOPPING=1"
# the stop asks for time beyond TimeoutStopSec while it runs (a drain and
# checkpoints of persistent sessions can outlast it)
awk '/^STOPPING=1/{s=NR} /^EXTEND_TIMEOUT_USEC=15000000$/{if (s && NR > s) ok=1} END{exit !ok}' "$NOTIFY_LOG" ||
	fail "no EXTEND_TIMEOUT_USEC after STOPPING=1: $(tr '\n' ' ' <"$NOTIFY_LOG")"
[ -e "$T/run/control.sock" ] && fail "control.sock left behind"

# SIGINT too, and the watchdog: WATCHDOG_USEC=400ms → WATCHDOG=1 every 200 ms
: >"$NOTIFY_LOG"
NOTIFY_SOCKET=$T/notify.sock WATCHDOG_USEC=400000 start_daemon
wait_for '^READY=1' "$NOTIFY_LOG"
sleep 0.7
[ "$(grep -c '^WATCHDOG=1' "$NOTIFY_LOG")" -ge 3 ] || fail "WATCHDOG=1 not sent every 200 ms"
stop_daemon INT
[ "$STOP_RC" = 0 ] || fail "SIGINT: exit $STOP_RC"
echo "ok: readiness, reload, watchdog, stop ($STOP_MS ms)"
