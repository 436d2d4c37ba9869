#!/usr/bin/env python3
"""ref-forward.py — an independent llama forward pass over a GGUF model, in numpy.

    scripts/ref-forward.py MODEL.gguf [--tokens 1,504,3458] [--out LOGITS.bin]
                           [--rope adjacent|neox] [--text "The capital of France is"]

The reference for tqkv-run's GGUF path (client/run/model_gguf.c, model.c):
weights dequantized by the `gguf` package (gguf.quants.dequantize, not
tqkv-run's code), float64 arithmetic throughout, RMSNorm with the file's
epsilon, RoPE with the file's freq_base on adjacent pairs (llama.cpp's
LLM_ARCH_LLAMA: the HF->GGUF converter permutes the Q/K rows for it), GQA
attention, SwiGLU, tied classifier when output.weight is absent.

Prints, per position, the argmax and the logits' max, then the mean negative
log-likelihood of each next token (the sequence's own tokens).  --out writes
the logits as float32 [n][vocab] (tests/integration/gguf_ref.sh compares
tqkv-run's forward with them).  --rope neox rotates the halves (i, i + d/2)
instead: on real text its NLL is far worse, which is how the convention was
checked.  --text looks words up in the vocabulary (whole-word tokens only,
'Ġ' for a leading space) to build a natural sequence without a tokenizer.
Exit 77 when numpy or gguf is missing.
"""
import argparse
import sys

try:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
except ImportError as e:  # the test skips
    print(f"ref-forward.py: {e} (pip install numpy gguf)", file=sys.stderr)
    sys.exit(77)


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    return f.contents()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", default="1,504,3458,282,260,1345,30")
    ap.add_argument("--text")
    ap.add_argument("--out")
    ap.add_argument("--rope", choices=["adjacent", "neox"], default="adjacent")
    a = ap.parse_args()

    r = GGUFReader(a.model)
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit(f"ref-forward.py: architecture {arch!r}, not llama")
    D = int(field(r, "llama.embedding_length"))
    L = int(field(r, "llama.block_count"))
    H = int(field(r, "llama.attention.head_count"))
    HKV = int(field(r, "llama.attention.head_count_kv", H))
    theta = float(field(r, "llama.rope.freq_base", 10000.0))
    eps = float(field(r, "llama.attention.layer_norm_rms_epsilon", 1e-5))
    hd = D // H
    T = {t.name: t for t in r.tensors}

    def W(name):
        t = T[name]
        return dequantize(t.data, t.tensor_type).astype(np.float64).reshape(
            [int(x) for x in reversed(t.shape)])

    vocab = [bytes(r.fields["tokenizer.ggml.tokens"].parts[i]).decode("utf-8", "replace")
             for i in r.fields["tokenizer.ggml.tokens"].data]
    if a.text:
        ids = {s: i for i, s in enumerate(vocab)}
        toks = [1]
        for k, w in enumerate(a.text.split(" ")):
            s = ("Ġ" if k else "") + w
            if s not in ids:
                sys.exit(f"ref-forward.py: {s!r} is not one token")
            toks.append(ids[s])
    else:
        toks = [int(x) for x in a.tokens.split(",")]
    n = len(toks)

    emb = W("token_embd.weight")                  # [V][D]
    wcls = W("output.weight") if "output.weight" in T else emb
    x = emb[toks].copy()                          # [n][D]

    def rmsnorm(v, w):
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * w

    pos = np.arange(n, dtype=np.float64)[:, None]
    freq = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos * freq                               # [n][hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(v):                                   # [n][heads][hd]
        o = v.copy()
        if a.rope == "adjacent":
            e, od = v[..., 0::2], v[..., 1::2]
            o[..., 0::2] = e * cos - od * sin
            o[..., 1::2] = e * sin + od * cos
        else:
            h2 = hd // 2
            e, od = v[..., :h2], v[..., h2:]
            o[..., :h2] = e * cos - od * sin
            o[..., h2:] = e * sin + od * cos
        return o

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(L):
        p = f"blk.{l}."
        h = rmsnorm(x, W(p + "attn_norm.weight"))
        q = rope((h @ W(p + "attn_q.weight").T).reshape(n, H, hd))
        k = rope((h @ W(p + "attn_k.weight").T).reshape(n, HKV, hd))
        v = (h @ W(p + "attn_v.weight").T).reshape(n, HKV, hd)
        att = np.empty((n, H, hd))
        for hh in range(H):
            kh = hh // (H // HKV)
            s = q[:, hh, :] @ k[:, kh, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            att[:, hh, :] = s @ v[:, kh, :]
        x = x + att.reshape(n, D) @ W(p + "attn_output.weight").T
        h = rmsnorm(x, W(p + "ffn_norm.weight"))
        g = h @ W(p + "ffn_gate.weight").T
        u = h @ W(p + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ W(p + "ffn_down.weight").T
    logits = rmsnorm(x, W("output_norm.weight")) @ wcls.T   # [n][V]

    print(f"tokens: {toks}")
    print("pieces: " + " | ".join(repr(vocab[t]) for t in toks))
    nll = 0.0
    for i in range(n):
        lg = logits[i]
        am = int(np.argmax(lg))
        m = lg.max()
        lse = m + np.log(np.exp(lg - m).sum())
        if i + 1 < n:
            nll += lse - lg[toks[i + 1]]
        print(f"pos {i}: argmax {am} {vocab[am]!r} max {m:.6f} logit[0] {lg[0]:.6f} "
              f"sum {lg.sum():.6f}")
    if n > 1:
        print(f"rope {a.rope}: mean NLL of the next tokens {nll / (n - 1):.4f} nats")
    print(f"checksum: sum {logits.sum():.6f} sum|x| {np.abs(logits).sum():.6f}")
    if a.out:
        logits.astype(np.float32).tofile(a.out)


if __name__ == "__main__":
    main()
