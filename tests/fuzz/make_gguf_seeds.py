#!/usr/bin/env python3
"""make_gguf_seeds.py — writes the hand-made seeds of fuzz_gguf into
tests/fuzz/seeds/gguf/ (tiny files; never a real model):
  kinds.gguf   one key of every value type, arrays of u32 and strings,
               general.alignment 64, tensors F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1
  llama.gguf   a 1-layer llama (dim 32, 4 heads, 2 KV heads, vocab 4)
               that tqkv-run loads: Q8_0 embedding, Q4_1 / Q4_0 / F16
               matrices, F32 norms, tied classifier
  empty.gguf   no keys, no tensors
  spm.gguf     tokenizer metadata only: a sentencepiece-style "llama"
               vocabulary (U+2581 spaces, scores, unknown / control / byte /
               normal / user-defined / unused types, add_bos_token,
               add_space_prefix) that tok_gguf.c loads
Plain struct packing, no gguf package: the seeds do not depend on it."""
import os
import random
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "gguf")
rnd = random.Random(13)


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, t, payload):
    return s(key) + struct.pack("<I", t) + payload


BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 3: (32, 20)}


def data_for(t, n):
    be, bb = BLOCK[t]
    out = bytearray()
    for _ in range(n // be):
        if t == 0:
            out += struct.pack("<f", rnd.uniform(-1, 1))
        elif t == 1:
            out += struct.pack("<e", rnd.uniform(-1, 1))
        elif t == 30:
            out += struct.pack("<f", rnd.uniform(-1, 1))[2:]
        elif t == 8:
            out += struct.pack("<e", 0.01) + bytes(rnd.randrange(256) for _ in range(32))
        elif t == 2:
            out += struct.pack("<e", 0.02) + bytes(rnd.randrange(256) for _ in range(16))
        else:
            out += struct.pack("<ee", 0.02, -0.15) + bytes(rnd.randrange(256) for _ in range(16))
    return bytes(out)


def gguf(kvs, tensors, align=32):
    """tensors: (name, [ne...], type, elements or bytes for a norm around 1)."""
    head = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs)) + b"".join(kvs)
    infos, blobs, off = b"", [], 0
    for name, ne, t, payload in tensors:
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne)
        infos += struct.pack("<IQ", t, off)
        blobs.append((off, payload))
        off += len(payload)
        off = (off + align - 1) // align * align
    out = bytearray(head + infos)
    out += bytes(-len(out) % align)
    base = len(out)
    for o, p in blobs:
        out += bytes(base + o - len(out))
        out += p
    return bytes(out)


def tensor(name, ne, t):
    n = 1
    for x in ne:
        n *= x
    return (name, ne, t, data_for(t, n))


def norm(name, n):
    return (name, [n], 0, b"".join(struct.pack("<f", 1 + rnd.uniform(-0.1, 0.1)) for _ in range(n)))


def main():
    os.makedirs(OUT, exist_ok=True)
    kinds = [
        kv("k.u8", 0, struct.pack("<B", 7)), kv("k.i8", 1, struct.pack("<b", -7)),
        kv("k.u16", 2, struct.pack("<H", 700)), kv("k.i16", 3, struct.pack("<h", -700)),
        kv("k.u32", 4, struct.pack("<I", 70000)), kv("k.i32", 5, struct.pack("<i", -70000)),
        kv("k.f32", 6, struct.pack("<f", 0.5)), kv("k.bool", 7, b"\x01"),
        kv("k.str", 8, s("llama")), kv("k.u64", 10, struct.pack("<Q", 1 << 40)),
        kv("k.i64", 11, struct.pack("<q", -(1 << 40))), kv("k.f64", 12, struct.pack("<d", 1e-5)),
        kv("k.arr", 9, struct.pack("<IQ", 4, 3) + struct.pack("<III", 1, 2, 3)),
        kv("k.strs", 9, struct.pack("<IQ", 8, 3) + s("a") + s("") + s("<|im_end|>")),
        kv("general.alignment", 4, struct.pack("<I", 64)),
    ]
    ts = [tensor("f32", [8], 0), tensor("f16", [4, 2], 1), tensor("bf16", [8], 30),
          tensor("q8_0", [32, 2], 8), tensor("q4_0", [32], 2), tensor("q4_1", [64], 3)]
    open(os.path.join(OUT, "kinds.gguf"), "wb").write(gguf(kinds, ts, 64))

    D, F, V, H, HKV, S = 32, 32, 4, 4, 2, 8
    meta = [
        kv("general.architecture", 8, s("llama")),
        kv("llama.embedding_length", 4, struct.pack("<I", D)),
        kv("llama.feed_forward_length", 4, struct.pack("<I", F)),
        kv("llama.block_count", 4, struct.pack("<I", 1)),
        kv("llama.attention.head_count", 4, struct.pack("<I", H)),
        kv("llama.attention.head_count_kv", 4, struct.pack("<I", HKV)),
        kv("llama.context_length", 4, struct.pack("<I", S)),
        kv("llama.rope.freq_base", 6, struct.pack("<f", 100000.0)),
        kv("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5)),
        kv("llama.rope.dimension_count", 4, struct.pack("<I", D // H)),
    ]
    KD = D // H * HKV
    ts = [tensor("token_embd.weight", [D, V], 8), norm("blk.0.attn_norm.weight", D),
          tensor("blk.0.attn_q.weight", [D, D], 3), tensor("blk.0.attn_k.weight", [D, KD], 3),
          tensor("blk.0.attn_v.weight", [D, KD], 2), tensor("blk.0.attn_output.weight", [D, D], 1),
          norm("blk.0.ffn_norm.weight", D), tensor("blk.0.ffn_gate.weight", [D, F], 3),
          tensor("blk.0.ffn_up.weight", [D, F], 3), tensor("blk.0.ffn_down.weight", [F, D], 8),
          norm("output_norm.weight", D)]
    open(os.path.join(OUT, "llama.gguf"), "wb").write(gguf(meta, ts))
    open(os.path.join(OUT, "empty.gguf"), "wb").write(gguf([], []))

    SP = "\u2581"
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in (0x0A, 0x20, 0x21, 0x34, 0x32, 0xC3, 0xA9, 0xFF)]
    types = [2, 3, 3] + [6] * 8
    for p, t in [(SP, 1), ("O", 1), ("n", 1), ("c", 1), ("e", 1), ("u", 1), ("p", 1), ("o", 1), ("a", 1),
                 ("t", 1), ("i", 1), ("m", 1), (",", 1), ("\u00e9", 1), ("On", 1), ("ce", 1), (SP + "u", 1),
                 (SP + "up", 1), ("on", 1), (SP + "a", 1), (SP + "t", 1), ("im", 1), (SP + "tim", 1),
                 ("<tool>", 4), ("xx", 5)]:
        toks.append(p)
        types.append(t)
    scores = [0.0] * 11 + [-float(i) for i in range(len(toks) - 11)]

    def arr(t, items, pack):
        return struct.pack("<IQ", t, len(items)) + b"".join(pack(x) for x in items)
    meta = [
        kv("tokenizer.ggml.model", 8, s("llama")),
        kv("tokenizer.ggml.tokens", 9, arr(8, toks, s)),
        kv("tokenizer.ggml.scores", 9, arr(6, scores, lambda x: struct.pack("<f", x))),
        kv("tokenizer.ggml.token_type", 9, arr(5, types, lambda x: struct.pack("<i", x))),
        kv("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
        kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
        kv("tokenizer.ggml.unknown_token_id", 4, struct.pack("<I", 0)),
        kv("tokenizer.ggml.add_bos_token", 7, b"\x01"),
        kv("tokenizer.ggml.add_space_prefix", 7, b"\x01"),
    ]
    open(os.path.join(OUT, "spm.gguf"), "wb").write(gguf(meta, []))


if __name__ == "__main__":
    main()
