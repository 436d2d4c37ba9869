#!/usr/bin/env python3
"""The sentencepiece-style ("llama") GGUF vocabulary's reference: token ids
from Google's `sentencepiece` and Hugging Face `tokenizers`, two
implementations independent of client/run/tokenizer.c.

    pip install gguf sentencepiece protobuf tokenizers
    python3 scripts/gen-spm-fixture.py [--tok ../shared/data/tok512.bin]
        writes tests/data/spm_tok512.txt (committed) and
        build/spm/tok512-vocab.gguf (not committed: it is tok512.bin's
        vocabulary; test_spm reads it when present)
    python3 scripts/gen-spm-fixture.py --random 3000 --out /tmp/spm_random.txt
        the same for random strings (a stress check, not committed):
        TQ_SPM_FIXTURE=/tmp/spm_random.txt build/tests/test_spm

The vocabulary is llama2.c's tokenizer.bin (stories260K's tok512.bin, a
sentencepiece BPE model trained with byte_fallback and the identity
normalizer) with spaces spelled U+2581 and GGUF token types: 0 <unk>
unknown (2), 1 <s> and 2 </s> control (3), "<0xXX>" byte (6), the rest
normal (1).  From it:
  - a GGUF file with only tokenizer metadata (gguf.GGUFWriter):
    tokenizer.ggml.model "llama", .tokens, .scores, .token_type,
    .bos/eos/unknown_token_id 1/2/0, .add_bos_token, .add_space_prefix;
  - a sentencepiece ModelProto (model_type BPE, byte_fallback,
    add_dummy_prefix, remove_extra_whitespaces off, identity
    normalization) loaded by the sentencepiece library: the reference;
  - a `tokenizers` BPE as transformers' LlamaConverter builds it (vocab,
    merges from SentencePieceExtractor's rule: every split of a piece into
    two pieces, ordered by the piece's score; byte_fallback; normalizer
    Prepend("\u2581") + Replace(" ", "\u2581")): a second opinion.
The script stops if the two disagree on any string.

Fixture lines: FLAGS <TAB> TEXT <TAB> IDS
  FLAGS  "-" (reserved: no BOS, no special-token parsing)
  TEXT   UTF-8 kept as is; \\\\ \\t \\n \\r and \\xHH (other control bytes)
         escaped
  IDS    space-separated token ids without BOS (empty for no tokens)
"""
import argparse
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SP = "\u2581"


def read_tokbin(path):
    data = open(path, "rb").read()
    off, toks, scores = 4, [], []
    while off < len(data):
        sc, n = struct.unpack_from("<fi", data, off)
        off += 8
        toks.append(data[off:off + n].decode("utf-8"))
        scores.append(sc)
        off += n
    return toks, scores


def is_byte(t):
    return len(t) == 6 and t.startswith("<0x") and t.endswith(">")


def vocab_of(path):
    toks, scores = read_tokbin(path)
    pieces = [t.replace(" ", SP) for t in toks]
    types = [2 if i == 0 else 3 if i in (1, 2) else 6 if is_byte(t) else 1 for i, t in enumerate(pieces)]
    return pieces, scores, types


def write_gguf(path, pieces, scores, types):
    import gguf
    os.makedirs(os.path.dirname(path), exist_ok=True)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sentencepiece_ref(pieces, scores, types):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    ty = {1: pb.ModelProto.SentencePiece.NORMAL, 2: pb.ModelProto.SentencePiece.UNKNOWN,
          3: pb.ModelProto.SentencePiece.CONTROL, 6: pb.ModelProto.SentencePiece.BYTE}
    for p, s, t in zip(pieces, scores, types):
        e = m.pieces.add()
        e.piece, e.score, e.type = p, s, ty[t]
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = len(pieces)
    ts.byte_fallback = True
    ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = 0, 1, 2, -1
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = True
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp


def hf_ref(pieces, scores, types):
    from tokenizers import Tokenizer, decoders, models, normalizers
    vocab = {p: i for i, p in enumerate(pieces)}
    # transformers' generate_merges(vocab, vocab_scores)
    merges = []
    for piece, score in zip(pieces, scores):
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: x[2], reverse=True)
    bpe = models.BPE(vocab, [(a, b) for a, b, _ in merges], unk_token=pieces[0], fuse_unk=True,
                     byte_fallback=True)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    tok.decoder = decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    # <unk> <s> </s> are not added tokens here: the fixture is about text
    # without special-token parsing (llama.cpp's parse_special = false)
    return tok


def escape(s):
    out = []
    for ch in s:
        o = ord(ch)
        out.append({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(ch) or
                   (f"\\x{o:02X}" if o < 0x20 or o == 0x7F else ch))
    return "".join(out)


CASES = [
    "", "a", " ", "  ", "   ", "\n", "\t", " a", "a ", "  a  ", "Hello, world!",
    "Once upon a time, there was a little girl named Lily.",
    "The quick brown fox jumps over the lazy dog.",
    "Lily and Tom were best friends. They liked to play in the park every day.",
    "\"I'm sure you've heard,\" said Mom. \"It's what we'd do!\"",
    "don't won't can't 'twas ''s",
    "12345 3.14159 2024-01-01 0 00 007 1,000,000",
    "line one\nline two\n\nline four\n",
    "tabs\tand\t\tspaces   mixed \t \n end",
    "   leading spaces", "trailing spaces   ", " \n \n ",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m fa\u00e7ade",
    "Stra\u00dfe GROSS \u0130stanbul \u00fcber",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u6f22\u5b57",
    "\u4e2d\u6587\uff1a\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "emoji \U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F1EB\U0001F1F7!",
    "e\u0301 a\u0300\u0316 combining",
    "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0438 \u0440\u0443\u0441\u0441\u043a\u0438\u0439",
    "\u00bd \u2167 \u00b2\u00b3 \u0968\u0969",
    "a\u2581b \u2581 \u2581\u2581x",  # a literal U+2581 is a space to the reference
    "<s> </s> <unk> <0x41>",  # special tokens' text, no special-token parsing
    "\x01\x7f control \x1b[0m",
    "!!!??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( )))",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "the the the the the the the the",
    "ThE QuIcK BrOwN FoX",
    "x" * 3 + " " * 7 + "y",
    "Tim saw a big red ball. He ran to get it, but the dog got it first!",
    "Mia was sad because her toy was broken. Her dad said, \"Let's fix it together.\"",
    "One day, a kind old man gave the children some sweet candy and warm bread.",
    "Sue's cat, Max, loves to jump and play with the yellow string all day long.",
    "They smiled and hugged. The end.",
]


def random_cases(n, seed):
    rnd = random.Random(seed)
    parts = ["a", "b", "the", "The", " ", "  ", "\n", "\t", "7", "42", ".", ",", "'", "\"", "\u00e9", "\u00fc",
             "\u65e5\u672c", "\U0001F600", "\u2581", "Lily", " was", "happy", "<s>", "\x01", "\u0416", "ing"]
    return ["".join(rnd.choice(parts) for _ in range(rnd.randrange(0, 30))) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok", default=os.path.join(ROOT, "..", "shared", "data", "tok512.bin"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "spm_tok512.txt"))
    ap.add_argument("--gguf", default=os.path.join(ROOT, "build", "spm", "tok512-vocab.gguf"))
    ap.add_argument("--random", type=int, default=0, help="N random strings instead of the fixed set")
    a = ap.parse_args()

    pieces, scores, types = vocab_of(a.tok)
    if a.gguf:
        write_gguf(a.gguf, pieces, scores, types)
    sp = sentencepiece_ref(pieces, scores, types)
    hf = hf_ref(pieces, scores, types)
    cases = random_cases(a.random, 11) if a.random else CASES

    import sentencepiece
    import tokenizers
    lines = [
        "# spm_tok512.txt — GENERATED by scripts/gen-spm-fixture.py; do not edit.",
        f"# Reference: sentencepiece {sentencepiece.__version__} (BPE ModelProto from tok512.bin's vocabulary,",
        f"# byte_fallback, identity normalizer), checked against Hugging Face tokenizers {tokenizers.__version__}",
        "# (LlamaConverter-style BPE); see the script.  FLAGS<TAB>TEXT<TAB>IDS, ids without BOS.",
    ]
    bad = 0
    for s in cases:
        a_ids = sp.EncodeAsIds(s)
        b_ids = hf.encode(s, add_special_tokens=False).ids if s else []
        if a_ids != b_ids:
            bad += 1
            print(f"disagree on {s!r}:\n  sentencepiece {a_ids}\n  tokenizers    {b_ids}", file=sys.stderr)
        lines.append("-\t" + escape(s) + "\t" + " ".join(map(str, a_ids)))
    if bad:
        sys.exit(f"{bad} strings: the two references disagree")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    open(a.out, "w", encoding="utf-8").write("\n".join(lines) + "\n")
    print(f"{a.out}: {len(cases)} strings; {a.gguf or '(no gguf)'}")


if __name__ == "__main__":
    main()
