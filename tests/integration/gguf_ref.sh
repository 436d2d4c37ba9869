#!/usr/bin/env bash
# tqkv-run's GGUF path against independent references, on SmolLM2-135M
# (scripts/get-models.sh puts it in build/models/; $TQ_GGUF_MODEL overrides):
#   - tensors of each weight type (Q8_0, Q4_1, F32) dequantized by the
#     `gguf` package: bit-exact;
#   - the logits of a token sequence from scripts/ref-forward.py (numpy,
#     float64, weights from the `gguf` package) against tqkv-run's forward
#     with the exact fp32 KV cache: same argmax, small relative difference.
# Skips (77) when the model, numpy or gguf is missing.
set -u
cd "$TQ_SRC"
model=${TQ_GGUF_MODEL:-$TQ_BUILD/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$model" ] || { echo "skip: $model is absent (scripts/get-models.sh fetches it)"; exit 77; }
out=$(mktemp -d "${TMPDIR:-/tmp}/gguf_ref.XXXXXX")
trap 'rm -rf "$out"' EXIT
# numpy and gguf: the system's, else a venv under the build tree (pinned;
# skipped only when neither can be had; make test makes it beside the build)
py=$(TQ_BUILD="$TQ_BUILD" scripts/py-venv.sh 2>"$out/venv.log") ||
	{ echo "skip: $(tail -n 1 "$out/venv.log")"; exit 77; }
set -e
tensors="token_embd.weight blk.0.attn_q.weight blk.29.ffn_down.weight blk.7.attn_norm.weight output_norm.weight"
"$py" scripts/ref-dequant.py "$model" "$out" $tensors
"$TQ_BUILD/tests/test_gguf" --dequant "$model" "$out" $tensors
# "<|im_start|>The capital of France is Paris. The capital of Germany is" (ids
# looked up in the vocabulary): the last argmax is " Berlin" (11452)
ids=1,504,3575,282,4649,314,7042,30,378,3575,282,4521,314
"$py" scripts/ref-forward.py "$model" --tokens "$ids" --out "$out/logits.bin"
"$TQ_BUILD/tests/test_gguf" --forward "$model" "$out/logits.bin" "$ids"
