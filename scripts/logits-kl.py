#!/usr/bin/env python3
"""logits-kl.py — how far one run's next-token distributions are from another's.

    scripts/logits-kl.py BASE.f32 TEST.f32 --vocab N [--json]

BASE and TEST are `tqkv-run ppl --logits-out` files of the same text and
windows (float32 [positions][vocab], rows in the order scored).  Prints, over
the positions: the mean KL divergence KL(P_base || P_test) in nats, its 99th
percentile and maximum, how often the two argmaxes agree, and the RMS of the
difference of the probability of the base's argmax token — the measures
llama.cpp's `llama-perplexity --kl-divergence` reports, sharper than a
difference of perplexities (which sums errors of both signs).

An evaluation script (numpy); nothing of the daemon or libtqkv runs Python.
"""
import argparse
import json
import os
import sys

try:
    import numpy as np
except ImportError:
    print("logits-kl: needs numpy", file=sys.stderr)
    sys.exit(77)


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("test")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    row = 4 * a.vocab
    nb, nt = os.path.getsize(a.base), os.path.getsize(a.test)
    if a.vocab <= 0 or nb % row or nt != nb:
        print(f"logits-kl: sizes {nb} and {nt} are not the same whole number of "
              f"rows of {a.vocab} floats", file=sys.stderr)
        return 2
    n = nb // row
    B = np.memmap(a.base, dtype=np.float32, mode="r", shape=(n, a.vocab))
    T = np.memmap(a.test, dtype=np.float32, mode="r", shape=(n, a.vocab))
    kls, agree, dp = [], 0, []
    for i in range(0, n, 256):
        b = B[i:i + 256].astype(np.float64)
        t = T[i:i + 256].astype(np.float64)
        if not (np.isfinite(b).all() and np.isfinite(t).all()):
            print(f"logits-kl: non-finite logits in rows {i}..{i + len(b) - 1}", file=sys.stderr)
            return 1
        lb, lt = log_softmax(b), log_softmax(t)
        pb = np.exp(lb)
        kls.append((pb * (lb - lt)).sum(axis=1))
        ab, at = lb.argmax(axis=1), lt.argmax(axis=1)
        agree += int((ab == at).sum())
        r = np.arange(len(ab))
        dp.append(np.exp(lt[r, ab]) - pb[r, ab])
    kl = np.concatenate(kls)
    dp = np.concatenate(dp)
    res = {
        "positions": int(n),
        "kl_mean": float(kl.mean()),
        "kl_p99": float(np.percentile(kl, 99)),
        "kl_max": float(kl.max()),
        "top1_agree": agree / n,
        "dp_rms": float(np.sqrt((dp * dp).mean())),
    }
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{n} positions: KL mean {res['kl_mean']:.6f} nats, p99 {res['kl_p99']:.6f}, "
              f"max {res['kl_max']:.4f}; top-1 agree {100 * res['top1_agree']:.2f} %; "
              f"RMS dp(base argmax) {res['dp_rms']:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
