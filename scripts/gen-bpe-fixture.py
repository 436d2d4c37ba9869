#!/usr/bin/env python3
"""The byte-level BPE tokenizer's reference: token ids from Hugging Face
`tokenizers`, an implementation independent of client/run/bpe.c.

    pip install gguf tokenizers
    python3 scripts/gen-bpe-fixture.py [--gguf build/models/SmolLM2-135M-Instruct.Q4_1.gguf]
        writes tests/data/bpe_smollm2.txt (committed) and
        build/models/SmolLM2-135M-Instruct.vocab (not committed; test_bpe reads it)
    python3 scripts/gen-bpe-fixture.py --random 5000 --out /tmp/bpe_random.txt
        the same for random strings (a stress check, not committed):
        TQ_BPE_FIXTURE=/tmp/bpe_random.txt build/tests/test_bpe
    python3 scripts/gen-bpe-fixture.py --check-classes
        compares every code point's class in client/run/bpe_unicode.h with
        what the reference's pre-tokenizer does with it

The reference tokenizer is built from the GGUF's vocabulary and merges only
(the model's tokenizer.json is not in the GGUF):
  BPE(vocab, merges, unk_token=None)    a byte whose character is not a token
                                        is dropped (SmolLM2 has 235 of 256)
  Sequence[Digits(individual_digits=True),
           ByteLevel(add_prefix_space=False, use_regex=True)]
                                        SmolLM2's pre-tokenizer; llama.cpp's
                                        "smollm" is "\\p{N}" then GPT-2's regex
  ByteLevel decoder; the control tokens (type 3) as special added tokens.

Fixture lines: FLAGS <TAB> TEXT <TAB> IDS
  FLAGS  "s": special tokens parsed (HF's default), "-": special token text
         is plain text (HF's encode_special_tokens = True)
  TEXT   the bytes, UTF-8 kept as is; \\\\ \\t \\n \\r and \\xHH (other
         control bytes, DEL, and bytes that are not valid UTF-8) escaped
  IDS    space-separated token ids (empty for no tokens)
Text that is not valid UTF-8 cannot enter `tokenizers`; its reference is
assembled from the reference's parts: the pre-tokenizer runs on the text
with every invalid byte replaced by U+FFFD (one code point of class "other"
per byte, as bpe.c sees it), and the BPE model (Model.tokenize) runs on each
piece's original bytes.  For valid text the script checks that this path
agrees with Tokenizer.encode.
"""
import argparse
import os
import struct
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()


def load_gguf(path):
    r = GGUFReader(path)
    f = r.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = f["tokenizer.ggml.merges"].contents()
    pre = f["tokenizer.ggml.pre"].contents()
    model = f["tokenizer.ggml.model"].contents()
    assert model == "gpt2", model
    return tokens, types, merges, pre


def build_reference(tokens, types, merges):
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab, pairs, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for t in specials:
        assert tok.token_to_id(t) == vocab[t], t
    return tok


def split_utf8(data):
    """[(bytes, is_valid_char)] per code point / invalid byte, like bpe.c."""
    out, i = [], 0
    while i < len(data):
        b = data[i]
        k = 1 if b < 0x80 else 2 if 0xC2 <= b <= 0xDF else 3 if 0xE0 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 0
        if k:
            try:
                data[i:i + k].decode("utf-8")
                out.append((data[i:i + k], True))
                i += k
                continue
            except UnicodeDecodeError:
                pass
        out.append((data[i:i + 1], False))
        i += 1
    return out


def reference_by_parts(tok, data):
    """Ids for arbitrary bytes (no special tokens): the reference's
    pre-tokenizer on the FFFD stand-in, its BPE on the original bytes."""
    units = split_utf8(data)
    text = "".join(u.decode("utf-8") if ok else "\ufffd" for u, ok in units)
    ids = []
    for _, (start, end) in tok.pre_tokenizer.pre_tokenize_str(text):
        raw = b"".join(u for u, _ in units[start:end])
        word = "".join(B2U[c] for c in raw)
        ids += [t.id for t in tok.model.tokenize(word)]
    return ids


def escape(data):
    out = []
    for u, ok in split_utf8(data):
        if not ok:
            out.append("\\x%02X" % u[0])
        elif u == b"\\":
            out.append("\\\\")
        elif u == b"\t":
            out.append("\\t")
        elif u == b"\n":
            out.append("\\n")
        elif u == b"\r":
            out.append("\\r")
        elif len(u) == 1 and (u[0] < 0x20 or u[0] == 0x7F):
            out.append("\\x%02X" % u[0])
        else:
            out.append(u.decode("utf-8"))
    return "".join(out)


def test_strings():
    """(parse_special, bytes): chosen to cover the pre-tokenizer's cases,
    not tuned to any implementation."""
    s = [
        "",
        "Hello, world!",
        "Once upon a time, there was a little girl named Lily.",
        "The quick brown fox jumps over the lazy dog.",
        "I'm sure you've heard: they'll say it's what we'd do, and I'M NOT.",
        "don't won't can't 'twas rock'n'roll ''s 'S 'Re",
        "café naïve résumé Ångström façade",
        "Straße GROSS ǅemal İstanbul",
        "日本語のテキストと漢字",
        "中文：你好，世界！",
        "한국어 텍스트",
        "emoji 😀👍🏽 👨‍👩‍👧 🇫🇷!",
        "e\u0301 a\u0300\u0316 combining marks\u0308",
        "שלום עולם مرحبا بالعالم",
        "Ελληνικά и русский текст",
        "१२३ ٤٥٦ ½ ⅷ ²³",
        "12345",
        "3.14159",
        "1,000,000 and 2024-01-31 at 10:45pm",
        "x1y22z333 v1.2.3",
        "   leading spaces",
        "trailing spaces   ",
        "a  b   c    d",
        "tabs\there\t\tand\t",
        "line one\nline two\n\n\nline five\n",
        "\r\n windows \r\n",
        " \n \n ",
        "\u00a0non-breaking\u2003em space\u3000ideographic",
        "def f(x):\n    return x ** 2  # square\n",
        "int main(void) { printf(\"%d\\n\", a[i]); return 0; }",
        "if (a && b || !c) { x += 1; } // done",
        "https://example.com/path?q=1&r=two#frag",
        "user@example.org <tag attr=\"v\"/> $100 50% #1",
        "!!!??? ... --- ***",
        "ALLCAPS lowercase MiXeD camelCase snake_case",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
        "text<|endoftext|>more text",
        "<|im_start|><|im_end|><|endoftext|>",
        "<|im_start|incomplete <|im_end| <repo_name>x<filename>",
        "control\x01\x04\x06\x13\x1d\x7f bytes",
        "a\x04b",
        "!\x04! (\x04) ==\x13==",
    ]
    out = [(True, x.encode("utf-8")) for x in s]
    # the same chat text with special parsing off
    out.append((False, "<|im_start|>user\nhi<|im_end|>\n".encode("utf-8")))
    out.append((False, "text<|endoftext|>more <repo_name>".encode("utf-8")))
    # bytes that are not UTF-8
    out += [
        (True, b"invalid \xff byte"),
        (True, b"\xc3\x28 bad continuation"),
        (True, b"truncated \xe2\x82"),
        (True, b"overlong \xc0\xaf and \xe0\x80\xaf"),
        (True, b"surrogate \xed\xa0\x80 half"),
        (True, b"\x80\x81\x82 lone continuations"),
        (True, b"word\xfeword \xf4\x90\x80\x80 beyond"),
        (True, b"\xf0\x9f\x98"),
    ]
    # one long line of the TinyStories text (the longest)
    path = os.path.join(ROOT, "..", "shared", "data", "tinystories-dev.txt")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    out.append((True, max(lines, key=len)))
    return out


def random_strings(n, seed=13):
    """Random mixes of the pre-tokenizer's cases, valid and invalid UTF-8."""
    import random
    rnd = random.Random(seed)
    parts = ["a", "Z", "the", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000",
             "0", "7", "42", "\u0664", "\u00bd", "'", "'s", "'re", "'LL", "'d", ",", ".", "!?", "--",
             "(", ")", "{", "_", "$", "\u00e9", "e\u0301", "\u65e5\u672c", "\u0634", "\u05e9",
             "\U0001F600", "\u200d", "\U0001F3FD", "\u0130", "\u01c5", "<|im_start|>", "<|im_end|>",
             "<|endoftext|>", "<|im", "|>", "\x04", "\x7f", "\x00"]
    raw = [b"\xff", b"\xc3", b"\xe2\x82", b"\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]
    out = []
    for i in range(n):
        k = rnd.randint(0, 24)
        bad = i % 4 == 3
        pieces = [rnd.choice(parts).encode("utf-8") if not bad or rnd.random() < 0.8 else rnd.choice(raw)
                  for _ in range(k)]
        data = b"".join(pieces)
        if bad:
            data = data.replace(b"<|", b"<!")  # the by-parts reference has no special tokens
        out.append((rnd.random() < 0.8, data))
    return out


def write_vocab(path, tokens, types, merges, pre):
    """Little-endian: "TQBPEV1\\n", u32 n_tokens, u32 n_merges, u32 len +
    pre; per token i32 type, u32 len, bytes; per merge u32 len, bytes."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(b"TQBPEV1\n")
        pb = pre.encode()
        f.write(struct.pack("<III", len(tokens), len(merges), len(pb)) + pb)
        for t, ty in zip(tokens, types):
            tb = t.encode("utf-8")
            f.write(struct.pack("<iI", int(ty), len(tb)) + tb)
        for m in merges:
            mb = m.encode("utf-8")
            f.write(struct.pack("<I", len(mb)) + mb)
    os.replace(path + ".tmp", path)


def check_classes():
    """Every code point's class in bpe_unicode.h against the reference."""
    import re
    ranges = []
    with open(os.path.join(ROOT, "client", "run", "bpe_unicode.h")) as f:
        for m in re.finditer(r"\{ 0x([0-9A-F]+), 0x([0-9A-F]+), BPE_(\w+) \}", f.read()):
            ranges.append((int(m[1], 16), int(m[2], 16), m[3]))
    cls = {}
    for lo, hi, c in ranges:
        for cp in range(lo, hi + 1):
            cls[cp] = c
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    dg = pre_tokenizers.Digits(individual_digits=True)
    n = lambda p, s: len(p.pre_tokenize_str(s))
    bad = 0
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF or cp == 0x20:
            continue
        c = chr(cp)
        # "a"+c is one piece for a letter; c+"1" for a number; c+"!" for other
        ref = ("LETTER" if n(bl, "a" + c) == 1 else "NUMBER" if n(bl, c + "1") == 1
               else "OTHER" if n(bl, c + "!") == 1 else "SPACE")
        mine = cls.get(cp, "OTHER")
        digit = n(dg, "a" + c) == 2
        if ref != mine or digit != (mine == "NUMBER"):
            bad += 1
            if bad <= 40:
                print("U+%04X: table %s, ByteLevel %s, Digits %s" % (cp, mine, ref, digit))
    print("%d code points differ" % bad)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.join(ROOT, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "bpe_smollm2.txt"))
    ap.add_argument("--vocab-out", default=os.path.join(ROOT, "build", "models", "SmolLM2-135M-Instruct.vocab"))
    ap.add_argument("--check-classes", action="store_true")
    ap.add_argument("--random", type=int, default=0, help="N random strings instead of the test set")
    a = ap.parse_args()
    if a.check_classes:
        return check_classes()
    tokens, types, merges, pre = load_gguf(a.gguf)
    tok = build_reference(tokens, types, merges)
    write_vocab(a.vocab_out, tokens, types, merges, pre)
    lines = [
        "# bpe_smollm2.txt — GENERATED by scripts/gen-bpe-fixture.py; do not edit.",
        "# Reference: Hugging Face tokenizers %s, BPE from %s's vocabulary and merges"
        % (__import__("tokenizers").__version__, os.path.basename(a.gguf)),
        "# (pre \"%s\": Digits(individual_digits) + ByteLevel(GPT-2 regex)); see the script." % pre,
        "# FLAGS<TAB>TEXT<TAB>IDS   FLAGS s: special tokens parsed, -: plain text",
    ]
    for special, data in (random_strings(a.random) if a.random else test_strings()):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None:
            ids = reference_by_parts(tok, data)
        else:
            tok.encode_special_tokens = not special
            ids = tok.encode(text, add_special_tokens=False).ids
            if not any(t in text for t, ty in zip(tokens, types) if ty == 3):
                assert ids == reference_by_parts(tok, data), (text, ids)
        lines.append("%s\t%s\t%s" % ("s" if special else "-", escape(data), " ".join(map(str, ids))))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("%s: %d cases; %s" % (a.out, len(lines) - 4, a.vocab_out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
