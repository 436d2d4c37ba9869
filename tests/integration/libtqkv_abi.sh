#!/usr/bin/env bash
# libtqkv's binary interface, as the shared library exports it:
#  - exactly the symbols and versions client/libtqkv.map has released
#    (listed here: removing or re-versioning one breaks programs built
#    against an older libtqkv, so it must fail a test, not go unnoticed),
#    nothing else (no protobuf-c, gRPC or internal names);
#  - the soname;
#  - a program built the way one against 0.1/0.2 is (tests/abi/tqkv_abi.c:
#    the old versions of tqkv_connect, tqkv_session_open and
#    tqkv_session_info with the shorter structs of those releases) works
#    against a real tqkvd, with tqkv_client_id, tqkv_session_checkpoint
#    and tqkv_session_drop.
. "$(dirname "$0")/lib/daemon.bash"
B=${TQ_BUILD:-$PWD/build}
ABI=$B/tests/tqkv_abi
SO=$(ls "$B"/lib/libtqkv.so.*.*.* 2>/dev/null | head -n 1)
[ -x "$ABI" ] && [ -n "$SO" ] || { echo "tqkv_abi or libtqkv.so not built"; exit 77; }
command -v nm >/dev/null && command -v readelf >/dev/null || { echo "no nm/readelf (binutils)"; exit 77; }

# 1. the exported set: every released name@version, the newest as default
want=$(sort <<'ABI'
tqkv_append@@TQKV_0.1
tqkv_append_attend@@TQKV_0.1
tqkv_attend@@TQKV_0.1
tqkv_client_id@@TQKV_0.1
tqkv_connect@@TQKV_0.2
tqkv_connect@TQKV_0.1
tqkv_disconnect@@TQKV_0.1
tqkv_last_error@@TQKV_0.1
tqkv_nop@@TQKV_0.1
tqkv_session_attach@@TQKV_0.1
tqkv_session_attach_name@@TQKV_0.2
tqkv_session_checkpoint@@TQKV_0.2
tqkv_session_close@@TQKV_0.1
tqkv_session_detach@@TQKV_0.1
tqkv_session_drop@@TQKV_0.4
tqkv_session_id@@TQKV_0.1
tqkv_session_info@@TQKV_0.3
tqkv_session_info@TQKV_0.2
tqkv_session_open@@TQKV_0.3
tqkv_session_open@TQKV_0.1
tqkv_session_prefetch@@TQKV_0.2
tqkv_session_seed@@TQKV_0.1
tqkv_status_name@@TQKV_0.1
tqkv_strerror@@TQKV_0.1
tqkv_submit_append@@TQKV_0.1
tqkv_submit_append_attend@@TQKV_0.1
tqkv_submit_attend@@TQKV_0.1
tqkv_submit_nop@@TQKV_0.1
tqkv_submit_truncate@@TQKV_0.1
tqkv_truncate@@TQKV_0.1
tqkv_wait@@TQKV_0.1
tqkv_wait_timeout@@TQKV_0.2
ABI
)
# defined dynamic symbols, less the version nodes themselves (TQKV_0.x as
# absolute symbols) and what a sanitizer runtime adds
have=$(nm -D --defined-only "$SO" | awk '$2 != "A" { print $3 }' \
	| grep -v -E '^(__asan|__ubsan|__tsan|__sanitizer|_init$|_fini$|_edata|_end|__bss_start)' | sort)
if [ "$have" != "$want" ]; then
	diff <(echo "$want") <(echo "$have") | sed 's/^/  /' >&2
	fail "libtqkv.so exports differ from the released ABI (< released, > built)"
fi
soname=$(readelf -d "$SO" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libtqkv.so.0 ] || fail "soname is '$soname', not libtqkv.so.0"
# the test program really binds the old versions
for v in tqkv_connect@TQKV_0.1 tqkv_session_open@TQKV_0.1 tqkv_session_info@TQKV_0.2; do
	nm -D --undefined-only "$ABI" | grep -q -F " $v" || fail "tqkv_abi does not call $v"
done

# 2. the old entry points against a real daemon
cat >"$T/tqkvd.conf" <<CONF
[pool]
pool_bytes = 64M
[tenant default]
limit = 32M
allow_uids = *
CONF
start_daemon --config "$T/tqkvd.conf"
wait_up
"$ABI" "$T/run" || fail "tqkv_abi"
[ "$(gstat sessions_open)" = 0 ] || fail "sessions left open: $(ctl sessions)"
[ "$(gstat checkpoints_total)" -ge 1 ] || fail "no checkpoint counted: $(ctl stats)"
echo "libtqkv ABI: $(echo "$want" | wc -l) symbols as released; old versions work"
