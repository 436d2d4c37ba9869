#!/usr/bin/env bash
# make demo — a real model end to end with its KV cache in tqkvd.
#
# Starts a private tqkvd on temporary directories, runs `tqkv-run generate`
# on Karpathy's stories260K (../shared/data) with a short prompt — the
# forward pass runs in tqkv-run, every layer's K/V goes to the daemon, which
# keeps it compressed (K q8, V tq4) and computes attention on the compressed
# pages — then asks SmolLM2-135M-Instruct (a real GGUF chat model, fetched
# by scripts/get-models.sh) a question the same way, shows the texts and the
# memory figures and stops the daemon.
#
# Environment: TQ_DATA (default ../shared/data), BIN (default build/bin),
# PROMPT, STEPS, K, V, SEED, QUESTION.
set -u
cd "$(dirname "$0")/.."

DATA=${TQ_DATA:-../shared/data}
BIN=${BIN:-build/bin}
PROMPT=${PROMPT:-Once upon a time, there was a little dragon who}
STEPS=${STEPS:-120}
K=${K:-q8}
V=${V:-tq4}
SEED=${SEED:-42}
QUESTION=${QUESTION:-What is the capital of France, and what is it famous for?}

if [ -t 1 ]; then
	say() { printf '\033[1m%s\033[0m\n' "$*"; }
else
	say() { printf '%s\n' "$*"; }
fi
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

for f in stories260K.bin tok512.bin; do
	[ -r "$DATA/$f" ] || die "$DATA/$f is missing: the demo needs the shared test data (stories260K.bin and tok512.bin from karpathy/llama2.c) in ../shared/data next to the repository, or TQ_DATA=DIR pointing at them"
done
for b in tqkvd tqkv-run; do
	[ -x "$BIN/$b" ] || die "$BIN/$b is not built: run 'make' first"
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tqkv-demo.XXXXXX") || die "cannot create a temporary directory"
pid=
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "1. Starting tqkvd on $tmp/run (pool: 1 GiB of host memory, tenant \"default\")"
"$BIN/tqkvd" --run-dir "$tmp/run" --spill-dir "$tmp/spill" >"$tmp/tqkvd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
	[ -S "$tmp/run/control.sock" ] && [ -S "$tmp/run/data.sock" ] && break
	kill -0 "$pid" 2>/dev/null || { cat "$tmp/tqkvd.log" >&2; die "tqkvd exited during start-up (log above)"; }
	sleep 0.1
done
[ -S "$tmp/run/data.sock" ] || { cat "$tmp/tqkvd.log" >&2; die "tqkvd did not open its sockets within 10 s"; }
echo "   tqkvd pid $pid is serving unix:$tmp/run/control.sock and data.sock"
echo

say "2. tqkv-run generate: stories260K (5 layers, 8 query / 4 KV heads, head_dim 8), KV cache in tqkvd as K=$K V=$V"
echo "   The prompt is processed in chunks (APPEND + causal ATTEND per layer), then"
echo "   each new token is one APPEND_ATTEND per layer on the shared-memory ring."
echo
"$BIN/tqkv-run" generate --model "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" \
	--prompt "$PROMPT" --steps "$STEPS" --seed "$SEED" --k "$K" --v "$V" --run-dir "$tmp/run"
rc=$?
echo
[ $rc -eq 0 ] || { sed 's/^/   tqkvd: /' "$tmp/tqkvd.log" | tail -n 20 >&2; die "tqkv-run failed (exit $rc)"; }

say "3. tqkv-run chat: SmolLM2-135M-Instruct (GGUF, 30 layers, 9 query / 3 KV heads, head_dim 64)"
if model=$(scripts/get-models.sh 2>"$tmp/models.log"); then
	echo "   The file's ChatML template wraps the question; the answer streams as it is"
	echo "   generated; the KV cache is in tqkvd (K=$K V=$V)."
	echo
	echo "   > $QUESTION"
	"$BIN/tqkv-run" chat --model "$model" --prompt "$QUESTION" --temperature 0 --steps 120 --ctx 1024 \
		--k "$K" --v "$V" --run-dir "$tmp/run" | sed 's/^/   /'
	[ "${PIPESTATUS[0]}" -eq 0 ] || { sed 's/^/   tqkvd: /' "$tmp/tqkvd.log" | tail -n 20 >&2; die "tqkv-run chat failed"; }
else
	echo "   skipped: $(tail -n 1 "$tmp/models.log")"
fi
echo

say "4. What the figures mean"
echo "   The KV lines compare the session's compressed blocks with an fp16 cache of"
echo "   the same tokens.  Each vector carries a 4-byte scale: 4 bits per value at"
echo "   stories260K's head_dim of 8 (q8/tq4 is 12 + 8 bits there), 0.5 at SmolLM2's"
echo "   64 (8.5 + 4.5 bits: 6.5 on average, 41 % of fp16), 0.25 at head_dim 128."
echo

say "5. Stopping tqkvd"
kill -TERM "$pid"
if wait "$pid"; then
	echo "   tqkvd exited cleanly"
else
	echo "   tqkvd exited with status $? (log: below)"; tail -n 5 "$tmp/tqkvd.log"
fi
pid=
