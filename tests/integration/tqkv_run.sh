#!/usr/bin/env bash
# tqkv_run — tqkv-run end to end on the shared real model (../shared/data):
#   - bad inputs (missing, truncated, resized, "ak42" or unsupported-head_dim
#     checkpoints, mismatched tokenizers, bad options) fail with a clear
#     message and a non-zero exit;
#   - generate and ppl in-process (--local), deterministic at temperature 0;
#   - a real tqkvd on temporary directories: the daemon path gives the same
#     logits, bit for bit, as --local for the same codecs, and the same text;
#     a tenant's sparse_v gives --local --sparse-v's logits, counted by tqctl.
# Skips (77) when ../shared/data is absent.
set -u
cd "$(dirname "$0")/../.."
BIN=${TQ_BIN:-build/bin}
DATA=${TQ_DATA:-../shared/data}
RUN="$BIN/tqkv-run"
M="$DATA/stories260K.bin"
T="$DATA/tok512.bin"
X="$DATA/tinystories-dev.txt"

if [ ! -r "$M" ] || [ ! -r "$T" ] || [ ! -r "$X" ]; then
	echo "skipped: $DATA (stories260K.bin, tok512.bin, tinystories-dev.txt) is absent"
	exit 77
fi
[ -x "$RUN" ] || { echo "FAIL: $RUN is not built"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tqkv_run.XXXXXX")
dpid=
cleanup() {
	if [ -n "$dpid" ] && kill -0 "$dpid" 2>/dev/null; then
		kill -TERM "$dpid"; wait "$dpid" 2>/dev/null
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_fail WANT_EXIT MESSAGE_SUBSTRING -- tqkv-run args...
expect_fail() {
	local want=$1 msg=$2; shift 3
	"$RUN" "$@" >"$tmp/out" 2>"$tmp/err"
	local rc=$?
	if [ "$rc" -ne "$want" ]; then
		fail "tqkv-run $* exited $rc, want $want; stderr: $(head -c 300 "$tmp/err")"
	elif ! grep -qF -- "$msg" "$tmp/err"; then
		fail "tqkv-run $* : stderr lacks '$msg': $(head -c 300 "$tmp/err")"
	else
		echo "ok   refused ($rc): $(head -n 1 "$tmp/err" | cut -c1-150)"
	fi
}

le32() { # little-endian int32s to stdout
	for v in "$@"; do
		printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((v & 255)) $(((v >> 8) & 255)) \
			$(((v >> 16) & 255)) $(((v >> 24) & 255)))"
	done
}

G=(generate --tokenizer "$T" --prompt "Once upon a time" --local --steps 20)

# ---- bad checkpoints ---------------------------------------------------------
expect_fail 1 "No such file" -- "${G[@]}" --model "$tmp/nope.bin"
head -c 1000000 "$M" >"$tmp/trunc.bin"
expect_fail 1 "truncated" -- "${G[@]}" --model "$tmp/trunc.bin"
head -c 20 "$M" >"$tmp/hdr.bin"
expect_fail 1 "truncated" -- "${G[@]}" --model "$tmp/hdr.bin"
{ cat "$M"; printf 'xxxx'; } >"$tmp/long.bin"
expect_fail 1 "wrong size" -- "${G[@]}" --model "$tmp/long.bin"
{ le32 $((0x616b3432)) 1; tail -c +9 "$M"; } >"$tmp/magic.bin"   # "ak42" magic, version 1
expect_fail 1 'version-1 export (magic "ak42")' -- "${G[@]}" --model "$tmp/magic.bin"
{ le32 64 172 5 8 4 512 -7; tail -c +29 "$M"; } >"$tmp/seq.bin"   # negative seq_len
expect_fail 1 "seq_len" -- "${G[@]}" --model "$tmp/seq.bin"
{ le32 64 172 5 8 4 600 512; tail -c +29 "$M"; } >"$tmp/vocab.bin" # sizes disagree with the file
expect_fail 1 "vocab_size 600, seq_len 512) implies 1079068" -- "${G[@]}" --model "$tmp/vocab.bin"
# a well-formed checkpoint with head_dim 12 (dim 48 / 4 heads): 19632 floats
{ le32 48 64 1 4 4 20 8; head -c $((19632 * 4)) /dev/zero; } >"$tmp/hd12.bin"
expect_fail 1 "head_dim 12" -- "${G[@]}" --model "$tmp/hd12.bin"
cp "$M" "$tmp/dir.bin" && rm "$tmp/dir.bin" && mkdir "$tmp/dir.bin"
expect_fail 1 "not a regular file" -- "${G[@]}" --model "$tmp/dir.bin"

# ---- bad tokenizers -------------------------------------------------------------
Gm=(generate --model "$M" --prompt "Once upon a time" --local --steps 20)
head -c 3000 "$T" >"$tmp/tok_trunc.bin"
expect_fail 1 "truncated" -- "${Gm[@]}" --tokenizer "$tmp/tok_trunc.bin"
{ cat "$T"; le32 0 2; printf 'zz'; } >"$tmp/tok_more.bin"           # one token too many
expect_fail 1 "tokenizer mismatch" -- "${Gm[@]}" --tokenizer "$tmp/tok_more.bin"
expect_fail 1 "max_token_length" -- "${Gm[@]}" --tokenizer "$M"     # a checkpoint is no tokenizer
expect_fail 1 "No such file" -- "${Gm[@]}" --tokenizer "$tmp/nope.bin"

# ---- bad options ------------------------------------------------------------------
expect_fail 2 "unknown codec" -- "${G[@]}" --model "$M" --k tq9
expect_fail 2 "--kv-transform: unknown mode 'k-eq-k+k-eq-qk'" -- "${G[@]}" --model "$M" --kv-transform k-eq-k+k-eq-qk
expect_fail 2 "needs --local" -- generate --model "$M" --tokenizer "$T" --prompt x --kv f32
expect_fail 2 "--model and --tokenizer are required" -- ppl "$X"
expect_fail 2 "--prompt is required" -- generate --model "$M" --tokenizer "$T" --local
expect_fail 2 "exactly one text FILE" -- ppl --model "$M" --tokenizer "$T" --local
expect_fail 2 "--top-p must be in [0, 1]" -- "${G[@]}" --model "$M" --top-p 1.5
expect_fail 2 "--temperature must be >= 0" -- "${G[@]}" --model "$M" --temperature -1
expect_fail 2 "is not an integer" -- "${G[@]}" --model "$M" --steps 12x
expect_fail 2 "unknown command" -- frobnicate
expect_fail 1 "No such file" -- ppl --model "$M" --tokenizer "$T" --local "$tmp/nope.txt"
printf 'Hi' >"$tmp/tiny.txt"
"$RUN" ppl --model "$M" --tokenizer "$T" --local "$tmp/tiny.txt" >/dev/null 2>&1 ||
	fail "ppl on a 2-byte text should score one short window"

# ---- in-process runs ---------------------------------------------------------------
out1=$("$RUN" generate --model "$M" --tokenizer "$T" --prompt "Once upon a time" --local \
	--steps 40 --temperature 0 2>&1) || fail "local generate failed: $out1"
out2=$("$RUN" generate --model "$M" --tokenizer "$T" --prompt "Once upon a time" --local \
	--steps 40 --temperature 0 2>&1) || fail "local generate failed: $out2"
text1=$(printf '%s\n' "$out1" | sed '/^---$/,$d')
text2=$(printf '%s\n' "$out2" | sed '/^---$/,$d')
[ "$text1" = "$text2" ] || fail "greedy generation is not deterministic"
case $text1 in "Once upon a time"*) ;; *) fail "the text does not start with the prompt: $text1" ;; esac
[ ${#text1} -gt 60 ] || fail "greedy generation produced too little text: $text1"
printf '%s\n' "$out1" | grep -q "KV cache (local q8/tq4).*for fp16" || fail "no KV figures: $out1"
echo "ok   local generate: $(printf '%s' "$text1" | head -c 100 | tr '\n' ' ')"

j=$("$RUN" ppl --model "$M" --tokenizer "$T" "$X" --local --kv f32 --windows 1 --json) ||
	fail "ppl --json failed"
for key in ppl tokens k v kv_bytes fp16_kv_bytes; do
	printf '%s' "$j" | grep -q "\"$key\":" || fail "ppl --json lacks $key: $j"
done
printf '%s' "$j" | grep -q '"tokens":511,' || fail "one window of 512 scores 511 tokens: $j"
echo "ok   local ppl: $j"

# --sessions: windows interleaved chunk by chunk give the same logits, bit
# for bit (the rows come in the order scored: reordered here)
"$RUN" ppl --model "$M" --tokenizer "$T" "$X" --local --windows 4 --logits-out "$tmp/s1.f32" >/dev/null &&
"$RUN" ppl --model "$M" --tokenizer "$T" "$X" --local --windows 4 --sessions 3 --logits-out "$tmp/s3.f32" \
	>/dev/null || fail "ppl --sessions 3 failed"
python3 - "$tmp/s1.f32" "$tmp/s3.f32" <<'PY' || fail "ppl --sessions 3 logits differ from one session's"
import sys
V, W, C, S, NW = 512 * 4, 511, 64, 3, 4   # row bytes, rows per window, chunk, sessions, windows
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
assert len(a) == len(b) == NW * W * V, (len(a), len(b))
rows = {}
off = 0
for w0 in range(0, NW, S):
    ws = range(w0, min(w0 + S, NW))
    for pos in range(0, W + 1, C):
        for w in ws:
            n = min(C, W - pos)
            for i in range(n):
                rows[(w, pos + i)] = b[off:off + V]; off += V
assert off == len(b)
for w in range(NW):
    for r in range(W):
        assert a[(w * W + r) * V:(w * W + r + 1) * V] == rows[(w, r)], (w, r)
PY
echo "ok   ppl --sessions 3: the logits of 4 windows are the bits of one session's"
expect_fail 2 "--sessions" -- ppl --model "$M" --tokenizer "$T" --local --sessions 0 "$X"

daemon_checks() {
	local P=(ppl --model "$M" --tokenizer "$T" "$X" --windows 1 --chunk 48) kv
	# K/V codecs and the transform (default: --kv-transform default)
	for kv in "q8 tq4 default" "f16 f16 default" "tq3 tq2 default" "q4a q4a default" "q8 tq4 none" \
		"tq3 tq2 k-center+v-center+k-eq-k"; do
		set -- $kv
		if ! "$RUN" "${P[@]}" --k "$1" --v "$2" --kv-transform "$3" --local --logits-out "$tmp/local.f32" --json \
			>"$tmp/lj" 2>"$tmp/err"; then
			fail "local ppl $1/$2: $(cat "$tmp/err")"
		elif ! "$RUN" "${P[@]}" --k "$1" --v "$2" --kv-transform "$3" --run-dir "$tmp/run" \
			--logits-out "$tmp/daemon.f32" --json >"$tmp/dj" 2>"$tmp/err"; then
			fail "daemon ppl $1/$2: $(cat "$tmp/err")"
		elif [ ! -s "$tmp/daemon.f32" ]; then
			fail "no logits from the daemon run"
		elif ! grep -q "\"kv_transform\":\"$([ "$3" = default ] && echo k-center+v-eq+k-eq-qk+k-unshrink+k-order || echo "$3")\"" "$tmp/dj"; then
			fail "$1/$2 $3: the daemon run reports another transform: $(cat "$tmp/dj")"
		elif cmp -s "$tmp/local.f32" "$tmp/daemon.f32"; then
			echo "ok   $1/$2 $3: daemon and --local logits identical ($(stat -c %s "$tmp/daemon.f32") bytes); $(cat "$tmp/dj")"
		else
			fail "$1/$2: daemon and --local logits differ: $(cat "$tmp/lj") vs $(cat "$tmp/dj")"
		fi
	done
	# a tenant with sparse-V: its sessions' logits are --local --sparse-v's,
	# bit for bit, not the exact ones, and tqctl counts what was skipped
	if ! "$RUN" "${P[@]}" --local --sparse-v 0.05 --logits-out "$tmp/local_sv.f32" >/dev/null 2>"$tmp/err" ||
		! "$RUN" "${P[@]}" --local --logits-out "$tmp/local_exact.f32" >/dev/null 2>>"$tmp/err"; then
		fail "local ppl --sparse-v: $(cat "$tmp/err")"
	elif ! "$RUN" "${P[@]}" --tenant sparse --run-dir "$tmp/run" --logits-out "$tmp/daemon_sv.f32" \
		>/dev/null 2>"$tmp/err"; then
		fail "daemon ppl in the sparse tenant: $(cat "$tmp/err")"
	elif cmp -s "$tmp/local_sv.f32" "$tmp/local_exact.f32"; then
		fail "--sparse-v 0.05 skipped nothing on this text: the check below proves nothing"
	elif ! cmp -s "$tmp/local_sv.f32" "$tmp/daemon_sv.f32"; then
		fail "tenant sparse_v = 0.05: the daemon's logits are not --local --sparse-v 0.05's"
	else
		local sk
		sk=$("$BIN/tqctl" --socket "$tmp/run/control.sock" tenants --json | python3 -c '
import json, sys
t = {x["name"]: x for x in json.load(sys.stdin)["tenants"]}
s, d = t["sparse"], t["default"]
print(int(s["value_chunks"]), int(s["value_chunks_skipped"]), int(d["value_chunks_skipped"]))')
		read -r chunks skipped dskipped <<<"$sk"
		if [ -z "$chunks" ] || [ "$chunks" -eq 0 ] || [ "$skipped" -eq 0 ] || [ "$skipped" -ge "$chunks" ] ||
			[ "$dskipped" -ne 0 ]; then
			fail "tqctl tenants --json: sparse tenant chunks/skipped '$chunks/$skipped', default skipped '$dskipped'"
		else
			echo "ok   tenant sparse_v = 0.05: daemon logits are --local --sparse-v 0.05's; $skipped of $chunks value chunks skipped"
		fi
	fi
	local dout dtext
	if ! dout=$("$RUN" generate --model "$M" --tokenizer "$T" --prompt "Once upon a time" --run-dir "$tmp/run" \
		--steps 40 --temperature 0 2>&1); then
		fail "daemon generate failed: $dout"
		return
	fi
	dtext=$(printf '%s\n' "$dout" | sed '/^---$/,$d')
	if [ "$dtext" != "$text1" ]; then
		fail "daemon and --local greedy texts differ: '$dtext' vs '$text1'"
	elif ! printf '%s\n' "$dout" | grep -q "KV cache (tqkvd q8/tq4, session [0-9]*), transform k-center+v-eq+k-eq-qk+k-unshrink+k-order: "; then
		fail "no daemon KV figures: $dout"
	else
		echo "ok   daemon generate, same text as --local: $(printf '%s\n' "$dout" | tail -n 1)"
	fi
	# a daemon that is not there
	expect_fail 1 "cannot reach tqkvd" -- generate --model "$M" --tokenizer "$T" --prompt x --run-dir "$tmp/none"
}

# ---- the daemon --------------------------------------------------------------------
if [ ! -x "$BIN/tqkvd" ]; then
	fail "$BIN/tqkvd is not built"
else
	cat >"$tmp/tqkvd.conf" <<CONF
[tenant default]
allow_uids = *
[tenant sparse]
allow_uids = *
sparse_v = 0.05
CONF
	"$BIN/tqkvd" --config "$tmp/tqkvd.conf" --run-dir "$tmp/run" --spill-dir "$tmp/spill" >"$tmp/tqkvd.log" 2>&1 &
	dpid=$!
	for _ in $(seq 100); do
		grep -q "ready" "$tmp/tqkvd.log" && break
		kill -0 "$dpid" 2>/dev/null || break
		sleep 0.1
	done
	for _ in $(seq 20); do # the data channel may open just after READY
		[ -S "$tmp/run/data.sock" ] && break
		sleep 0.05
	done
	if ! grep -q "ready" "$tmp/tqkvd.log"; then
		cat "$tmp/tqkvd.log"
		fail "tqkvd did not start"
	elif [ ! -S "$tmp/run/data.sock" ]; then
		fail "tqkvd is ready but serves no data channel ($tmp/run/data.sock)"
	else
		daemon_checks
	fi
	kill -TERM "$dpid"; wait "$dpid" 2>/dev/null; dpid=
fi

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
