#!/usr/bin/env bash
# A second uid attacking the first uid's session through a real tqkvd
# (issue 14, item 3): every tqctl command and every data operation on it —
# ATTACH by id and by name, APPEND, ATTEND, APPEND_ATTEND, TRUNCATE, DETACH,
# CLOSE, PREFETCH, opening a session under its name — is refused with a
# clear error, and the session is unchanged afterwards (the same attention
# output, bit for bit, and the same token count).  multiuser.sh checks the
# rights of each role; this one is the attack on one session, end to end.
# Needs root (it creates the two users and their group, and removes them).
. "$(dirname "$0")/lib/daemon.bash"
[ "$(id -u)" = 0 ] || { echo "skipped: needs root to create a second user"; exit 77; }
for tool in useradd groupadd userdel groupdel setpriv; do
	command -v $tool >/dev/null || { echo "skipped: no $tool"; exit 77; }
done

S=$$
CG=tqhc$S; UA=tqha$S; UB=tqhb$S
users_cleanup() {
	for u in $UA $UB; do pkill -KILL -u "$u" 2>/dev/null; done
	sleep 0.2
	for u in $UA $UB; do userdel -f "$u" 2>/dev/null; done
	groupdel "$CG" 2>/dev/null
}
trap 'exec 2>/dev/null; jobs -p | xargs -r kill -KILL 2>/dev/null; wait; cleanup; users_cleanup' EXIT
groupadd -r $CG || fail "groupadd"
useradd -r -M -N -g nogroup -G $CG -s /usr/sbin/nologin $UA || fail "useradd $UA"
useradd -r -M -N -g nogroup -G $CG -s /usr/sbin/nologin $UB || fail "useradd $UB"

chmod 0755 "$T"
mkdir -p "$T/bin" "$T/spill"
cp "$TQCTL" "${TQ_BUILD:-$PWD/build}/tests/test_hostile" "$T/bin/"
chmod 0755 "$T/bin"/*
mkdir -m 0750 "$T/run"
chgrp $CG "$T/run"
cat >"$T/tqkvd.conf" <<CONF
[daemon]
control_group = $CG
[pool]
pool_bytes = 64M
[tenant default]
limit = 32M
allow_uids = *
CONF
start_daemon --config "$T/tqkvd.conf"
wait_up

as() { local u=$1; shift; setpriv --reuid="$u" --regid=nogroup --init-groups "$@"; }
uctl() { local u=$1; shift; as "$u" "$T/bin/tqctl" --socket "$T/run/control.sock" "$@"; }
client() { local u=$1; shift; as "$u" "$T/bin/test_hostile" --client "$1" "$T/run" "${@:2}"; }

NAME=victim$S
out=$(client $UA fill $NAME) || fail "$UA could not fill a session: $out"
ID=${out%% *}
D0=$(client $UA digest "$ID") || fail "$UA's digest: $D0"
echo "$UA's session $ID: $D0"

# every control command of the second uid on it
expect_refused() { # WHY CMD...: refused, with WHY in the message
	local why=$1; shift
	local o
	o=$(uctl $UB "$@" 2>&1) && fail "$UB may '$*' on $UA's session $ID: $o"
	grep -q -- "$why" <<<"$o" || fail "'$*' by $UB was refused without '$why': $o"
	echo "refused tqctl $*: $(head -n 1 <<<"$o")"
}
expect_refused "belongs to another user" session "$ID"
expect_refused "belongs to another user" evict "$ID"
expect_refused "belongs to another user" close "$ID"
expect_refused "belongs to another user" checkpoint "$ID"
expect_refused "is for operators" spill "$ID"
expect_refused "is for operators" restore "$ID"
expect_refused "is for operators" budget set default --limit 1M
expect_refused "is for operators" config
# names are per owner: the second uid's open under the first's session's
# name makes a session of its own (the first's neither clashes nor shows)
out=$(uctl $UB open --tenant default --name "$NAME" --layers 2 --kv-heads 2 --q-heads 8 --head-dim 128 \
	--max-tokens 64 2>&1) || fail "$UB could not open a session of its own named $NAME: $out"
BID=$(awk '$1 == "id:" {print $2}' <<<"$out")
[ -n "$BID" ] && [ "$BID" != "$ID" ] || fail "$UB's open under $UA's session's name: id '$BID' ($UA's: $ID): $out"
uctl $UB close "$BID" >/dev/null || fail "$UB could not close its own session $BID ($out)"
uctl $UB sessions --json | grep -q "$NAME" && fail "$UB sees $UA's session in its list"
uctl $UB sessions --json | grep -q "\"id\": *\"\?$ID\b" && fail "$UB sees $UA's session id in its list"

# every data-path way in
out=$(client $UB intrude "$ID" "$NAME") || fail "the data path let $UB in: $out"
echo "$out"

# the first uid's session is unchanged: the same bits, the same tokens
D1=$(client $UA digest "$ID") || fail "$UA's digest after the attack: $D1"
[ "$D0" = "$D1" ] || fail "$UA's session changed under $UB's attack: '$D0' then '$D1'"
[ "$(sess "$ID" state)" = SESSION_STATE_OPEN ] || fail "session $ID state: $(sess "$ID" state)"
[ "$(sess "$ID" tokens)" = 300 ] || fail "session $ID tokens: $(sess "$ID" tokens)"
echo "after the attack: $D1"
# evicted while detached, its owner cannot attach it but can drop it by id
# (tqkv_session_drop); the second uid could not (intrude above)
uctl $UA evict "$ID" >/dev/null || fail "$UA cannot evict its own session"
out=$(client $UA drop "$ID") || fail "$UA could not drop its evicted session: $out"
grep -q "^attach: .*" <<<"$out" && ! grep -q "^attach: ok" <<<"$out" || fail "attach of an evicted session: $out"
echo "$out"
uctl $UA session "$ID" >/dev/null 2>&1 && fail "session $ID is still there after the drop"
echo ok
