#!/usr/bin/env bash
# `make install` honours PREFIX and DESTDIR, and the installed unit passes
# `systemd-analyze verify` (skipped when the tool is absent).
. "$(dirname "$0")/lib/daemon.bash"
command -v systemd-analyze >/dev/null || { echo "systemd-analyze missing"; exit 77; }

# make install with the binaries as built (-o: not remade, not relinked
# even when the tree changed since): other tests run them meanwhile
bin=${TQ_BIN#"$TQ_SRC"/}
mk() {
	make --no-print-directory -s -C "$TQ_SRC" -o "$bin/tqkvd" -o "$bin/tqctl" "$@" >"$T/make.log" 2>&1 ||
		{ cat "$T/make.log"; fail "make $*"; }
}

# DESTDIR: everything lands below it, the unit names the final paths
mk install DESTDIR="$T/pkg" PREFIX=/usr
for f in usr/sbin/tqkvd usr/bin/tqctl lib/systemd/system/tqkvd.service usr/lib/sysusers.d/tqkvd.conf etc/tqkvd/tqkvd.conf; do
	[ -f "$T/pkg/$f" ] || fail "make install DESTDIR: $f missing"
done
grep -q '^ExecStart=/usr/sbin/tqkvd --config /etc/tqkvd/tqkvd.conf' "$T/pkg/lib/systemd/system/tqkvd.service" \
	|| fail "ExecStart does not name the installed paths"
grep -q '^u tqkvd ' "$T/pkg/usr/lib/sysusers.d/tqkvd.conf" || fail "sysusers entry"
unit=$T/pkg/lib/systemd/system/tqkvd.service
for key in 'Type=notify' 'WatchdogSec=' 'Restart=on-failure' 'RuntimeDirectory=tqkvd' 'StateDirectory=tqkvd' \
	   'User=tqkvd' 'LimitMEMLOCK=' 'NoNewPrivileges=yes' 'ProtectSystem=strict' 'ProtectHome=yes' \
	   'PrivateTmp=yes' 'DeviceAllow=char-nvidia'; do
	grep -q "^$key" "$unit" || fail "unit lacks $key"
done
# an existing config is kept
echo "# mine" >>"$T/pkg/etc/tqkvd/tqkvd.conf"
mk install DESTDIR="$T/pkg" PREFIX=/usr
grep -q '^# mine' "$T/pkg/etc/tqkvd/tqkvd.conf" || fail "make install overwrote the config"

# PREFIX into a directory of ours, so the unit's ExecStart exists for verify
mk install PREFIX="$T/usr" SYSCONFDIR="$T/etc" UNITDIR="$T/units" SYSUSERSDIR="$T/sysusers"
out=$(systemd-analyze verify "$T/units/tqkvd.service" 2>&1) || fail "systemd-analyze verify: $out"
"$T/usr/sbin/tqkvd" --config "$T/etc/tqkvd/tqkvd.conf" --check-config >/dev/null 2>&1 || fail "installed config invalid"
echo ok
