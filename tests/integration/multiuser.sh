#!/usr/bin/env bash
# tqkvd as it is deployed: the daemon as its own system user (as the unit's
# User=tqkvd, RuntimeDirectoryMode=0750, umask 0022), inference clients as
# other users in daemon.control_group, an operator in daemon.operator_group,
# and an outsider in neither (issue 15, items 1, 2 and 6):
#  - data.sock, like control.sock, is 0660 and the control group's, so a
#    group member's libtqkv gets the data path and an outsider gets EACCES;
#  - a client may act on its own sessions only; evicting or closing another
#    user's session, budgets and the configuration are for operators;
#  - one uid at its max_clients_per_uid cap does not lock out another uid,
#    and a refused client always reads the daemon's reason.
# Needs root (it creates the users and groups, and removes them after).
. "$(dirname "$0")/lib/daemon.bash"
[ "$(id -u)" = 0 ] || { echo "skipped: needs root to create the users and groups it tests with"; exit 77; }
for tool in useradd groupadd userdel groupdel setpriv; do
	command -v $tool >/dev/null || { echo "skipped: no $tool"; exit 77; }
done

S=$$
DG=tqtd$S; CG=tqtc$S; OG=tqto$S          # the daemon's, the control and the operator group
DU=tqtd$S; CA=tqta$S; CB=tqtb$S; OP=tqtp$S; OUT=tqtx$S
users_cleanup() {
	for u in $CA $CB $OP $OUT; do pkill -KILL -u "$u" 2>/dev/null; done
	sleep 0.2
	for u in $DU $CA $CB $OP $OUT; do userdel -f "$u" 2>/dev/null; done
	for g in $DG $CG $OG; do groupdel "$g" 2>/dev/null; done
}
trap 'exec 2>/dev/null; jobs -p | xargs -r kill -KILL 2>/dev/null; wait; cleanup; users_cleanup' EXIT
groupadd -r $CG && groupadd -r $OG || fail "groupadd"
useradd -r -M -U -s /usr/sbin/nologin $DU || fail "useradd $DU"
usermod -a -G $CG $DU
useradd -r -M -N -g nogroup -G $CG -s /usr/sbin/nologin $CA || fail "useradd"
useradd -r -M -N -g nogroup -G $CG -s /usr/sbin/nologin $CB || fail "useradd"
useradd -r -M -N -g nogroup -G $CG,$OG -s /usr/sbin/nologin $OP || fail "useradd"
useradd -r -M -N -g nogroup -s /usr/sbin/nologin $OUT || fail "useradd"

# what each user runs, from a directory they can all read
chmod 0755 "$T"
mkdir -p "$T/bin" "$T/spill"
cp "$TQKVD" "$TQCTL" "${TQ_BUILD:-$PWD/build}/tests/test_ring" "$T/bin/"
chmod 0755 "$T/bin"/*
# systemd's RuntimeDirectory: owned by the daemon's user, mode 0750, group
# = the control group here (so its members may reach the sockets)
mkdir -m 0750 "$T/run"
chown $DU:$CG "$T/run"
chown $DU "$T/spill"
cat >"$T/tqkvd.conf" <<CONF
[daemon]
control_group = $CG
operator_group = $OG
max_clients = 8
max_clients_per_uid = 3
[pool]
pool_bytes = 128M
[tenant default]
limit = 64M
allow_uids = *
CONF
chmod 0644 "$T/tqkvd.conf"
(umask 0022; exec setpriv --reuid=$DU --regid=$DG --init-groups "$T/bin/tqkvd" --config "$T/tqkvd.conf" \
	--run-dir "$T/run" --spill-dir "$T/spill" >>"$LOG" 2>&1) &
DAEMON_PID=$!
wait_up

as() { local u=$1; shift; setpriv --reuid="$u" --regid=nogroup --init-groups "$@"; }
uctl() { local u=$1; shift; as "$u" "$T/bin/tqctl" --socket "$T/run/control.sock" "$@"; }
client() { local u=$1; shift; as "$u" "$T/bin/test_ring" --client "$1" "$T/run" "${@:2}"; }

# 1. both sockets: 0660, the control group's
for s in control.sock data.sock; do
	m=$(stat -c '%a %G' "$T/run/$s")
	[ "$m" = "660 $CG" ] || fail "$s is '$m', expected '660 $CG'"
done
out=$(client $CA life ephemeral 2>&1) || fail "a member of $CG cannot use the data path: $out"
out=$(client $OUT life ephemeral 2>&1) && fail "an outsider got in: $out"
grep -q "Permission denied" <<<"$out" || fail "an outsider's refusal: $out"

# 2. rights, per command, as a client and as an operator
client $CA hold detached >"$T/hold.out" 2>&1 &
for _ in $(seq 100); do grep -q ready "$T/hold.out" && break; sleep 0.1; done
ID=$(awk '/ready/ {print $1}' "$T/hold.out")
[ -n "$ID" ] || fail "client $CA did not get ready: $(cat "$T/hold.out")"
pkill -KILL -u $CA -f -- "--client hold"; wait %% 2>/dev/null     # the detached session stays
uctl $CA health >/dev/null || fail "a client cannot run health"
uctl $CA stats >/dev/null || fail "a client cannot run stats"
uctl $CA session "$ID" >/dev/null || fail "$CA cannot see its own session"
uctl $CB sessions --json | grep -q "\"id\": *\"\?$ID\b" && fail "$CB sees $CA's session in its list"
uctl $OP sessions --json | grep -q "$ID" || fail "the operator does not see $CA's session"
for cmd in "session $ID" "evict $ID" "close $ID"; do
	out=$(uctl $CB $cmd 2>&1) && fail "$CB may '$cmd' on $CA's session: $out"
	grep -q "belongs to another user" <<<"$out" || fail "'$cmd' by $CB: $out"
done
out=$(uctl $CA budget set default --limit 32M 2>&1) && fail "a client changed a budget: $out"
grep -q "is for operators" <<<"$out" || fail "budget by a client: $out"
out=$(uctl $CA config 2>&1) && fail "a client read the config: $out"
uctl $OP budget set default --limit 48M >/dev/null || fail "the operator cannot change a budget"
uctl $OP config >/dev/null || fail "the operator cannot read the config"
uctl $OP evict "$ID" >/dev/null || fail "the operator cannot evict $CA's session"
uctl $OP close "$ID" >/dev/null || fail "the operator cannot close $CA's session"
uctl $CA session "$ID" >/dev/null 2>&1 && fail "session $ID survived the operator's close"

# 6. one uid at its cap (3) does not lock out another uid
for _ in $(seq 50); do
	[ "$(ctl stats --json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("data_clients", 0))')" = 0 ] && break
	sleep 0.1
done
client $CA conns 3 hold >"$T/conns_a.out" 2>&1 &
for _ in $(seq 100); do grep -q connected "$T/conns_a.out" && break; sleep 0.1; done
grep -q "connected 3" "$T/conns_a.out" || fail "$CA could not connect 3 times: $(cat "$T/conns_a.out")"
for i in $(seq 10); do
	out=$(client $CA conns 1 exit 2>&1) && fail "$CA got a 4th data connection"
	grep -q "has 3 data connections already (daemon.max_clients_per_uid)" <<<"$out" \
		|| fail "refusal $i carries no reason: $out"
done
out=$(client $CB conns 1 exit 2>&1) || fail "$CB was locked out by $CA: $out"
echo "second uid's connect while the first is at its cap: ${out#*the last in }"
# and the total: 3 + 3 + 2 = max_clients 8, then the next is refused with why
client $CB conns 3 hold >"$T/conns_b.out" 2>&1 &
client $OP conns 2 hold >"$T/conns_o.out" 2>&1 &
for _ in $(seq 100); do grep -q connected "$T/conns_b.out" && grep -q connected "$T/conns_o.out" && break; sleep 0.1; done
grep -q connected "$T/conns_o.out" && grep -q connected "$T/conns_b.out" || fail "8 connections: $(cat "$T"/conns_*.out)"
out=$(client $OP conns 1 exit 2>&1) && fail "a 9th data connection got in"
grep -q "(daemon.max_clients)" <<<"$out" || fail "the 9th refusal: $out"
echo ok
