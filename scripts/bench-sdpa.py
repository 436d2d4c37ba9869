#!/usr/bin/env python3
"""bench-sdpa.py — the baseline of `tqbench attn --backend cuda`: PyTorch's
scaled_dot_product_attention over a bf16 KV cache of the same shape, on the
same GPU, for decode (1 query token that sees the whole context).

  scripts/bench-sdpa.py --ctx 8192,32768,131072 --batch 1,16 \
      --q-heads 32 --kv-heads 8 --dim 128 --device 0 --iters 50

Prints one JSON line per (ctx, batch):
  {"ctx":..,"batch":..,"q_heads":..,"kv_heads":..,"dim":..,"ms":..,
   "ms_min":..,"bytes":..,"gbps":..,"variant":..,"gpu":..,"torch":..,...}
  ms     median time of one call (all `batch` sessions in one call), CUDA
         events around each call, after --warmup calls;
  bytes  the bf16 K and V cache the call must read: batch x ctx x kv_heads x
         dim x 2 bytes x 2.
GQA (q_heads = G x kv_heads) without copying K/V to every query head:
  fold    the G query heads of a KV head become G query rows of that head
          (exact for decode: there is no causal mask), any torch version;
  native  enable_gqa=True (torch >= 2.5), when this torch has it;
  expand  K/V repeated to every query head (G x the bytes; only on request).
--gqa best (the default) times fold and native and reports the faster.

Failures are JSON lines too: {"error": "..."} alone (no torch, no GPU; exit
status 3 or 4), or with "ctx" and "batch" when one case failed (out of
memory), the others still run.  An evaluation script: never on tqkvd's path.
"""
import argparse
import json
import statistics
import sys


def ints(text):
    out = []
    for part in text.split(","):
        part = part.strip()
        mul = 1
        if part[-1:] in ("k", "K"):
            mul, part = 1024, part[:-1]
        try:
            value = int(part) * mul
        except ValueError:
            raise argparse.ArgumentTypeError("not a comma list of integers: %r" % text)
        if value < 1:
            raise argparse.ArgumentTypeError("values must be >= 1: %r" % text)
        out.append(value)
    return out


def emit(obj):
    print(json.dumps(obj, separators=(",", ":")), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", type=ints, default=ints("8192,32768,131072"),
                    help="contexts, comma list (k = x1024); default 8192,32768,131072")
    ap.add_argument("--batch", type=ints, default=[1, 16],
                    help="sessions per call, comma list; default 1,16")
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--device", type=int, default=0, help="CUDA device index")
    ap.add_argument("--iters", type=int, default=50, help="timed calls per case")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls first")
    ap.add_argument("--gqa", choices=("best", "fold", "native", "expand"), default="best")
    args = ap.parse_args()
    if args.q_heads < 1 or args.kv_heads < 1 or args.q_heads % args.kv_heads:
        ap.error("--q-heads must be a positive multiple of --kv-heads")
    if args.dim < 1 or args.iters < 1 or args.warmup < 0:
        ap.error("--dim and --iters must be >= 1, --warmup >= 0")

    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # ImportError, or a broken install
        emit({"error": "PyTorch is not importable (%s: %s)" % (type(e).__name__, e)})
        return 3
    if not torch.cuda.is_available():
        emit({"error": "torch %s sees no CUDA device (built with CUDA %s)"
                       % (torch.__version__, torch.version.cuda)})
        return 4
    if args.device >= torch.cuda.device_count():
        emit({"error": "no CUDA device %d (torch sees %d)" % (args.device, torch.cuda.device_count())})
        return 4

    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    gpu = torch.cuda.get_device_name(dev)
    hq, hkv, d, group = args.q_heads, args.kv_heads, args.dim, args.q_heads // args.kv_heads
    dt = torch.bfloat16
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)

    def has_native_gqa():
        try:
            q = torch.zeros(1, hq, 1, d, device=dev, dtype=dt)
            k = torch.zeros(1, hkv, 4, d, device=dev, dtype=dt)
            F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
            return True
        except (TypeError, RuntimeError):
            return False

    if args.gqa == "best":
        variants = ["fold"] + (["native"] if group > 1 and has_native_gqa() else [])
    elif args.gqa == "native" and not has_native_gqa():
        emit({"error": "torch %s has no enable_gqa" % torch.__version__})
        return 4
    else:
        variants = [args.gqa]

    def timed(fn):
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize(dev)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(args.iters):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times), min(times)

    status = 0
    with torch.inference_mode():
        for ctx in args.ctx:
            for b in args.batch:
                case = {"ctx": ctx, "batch": b, "q_heads": hq, "kv_heads": hkv, "dim": d}
                k = v = q = qf = ke = ve = fn = None
                try:
                    k = torch.randn(b, hkv, ctx, d, device=dev, dtype=dt)
                    v = torch.randn(b, hkv, ctx, d, device=dev, dtype=dt)
                    q = torch.randn(b, hq, 1, d, device=dev, dtype=dt)
                    results = {}
                    for var in variants:
                        if var == "fold":
                            # query head h = kv head h // G, row h % G
                            qf = q.reshape(b, hkv, group, d)
                            fn = lambda qf=qf: F.scaled_dot_product_attention(qf, k, v)
                        elif var == "native":
                            fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        else:
                            ke = k.repeat_interleave(group, dim=1)
                            ve = v.repeat_interleave(group, dim=1)
                            fn = lambda ke=ke, ve=ve: F.scaled_dot_product_attention(q, ke, ve)
                        results[var] = timed(fn)
                        fn = qf = ke = ve = None
                    best = min(results, key=lambda name: results[name][0])
                    ms, ms_min = results[best]
                    nbytes = b * ctx * hkv * d * 2 * 2
                    case.update({
                        "ms": ms, "ms_min": ms_min, "bytes": nbytes, "gbps": nbytes / (ms * 1e-3) / 1e9,
                        "variant": best, "variants_ms": {n: r[0] for n, r in results.items()},
                        "iters": args.iters, "dtype": "bf16", "gpu": gpu, "torch": torch.__version__,
                        "cuda": torch.version.cuda,
                    })
                except oom as e:
                    case["error"] = "out of memory: %s" % str(e).splitlines()[0][:120]
                    status = 5
                except RuntimeError as e:
                    case["error"] = "%s" % str(e).splitlines()[0][:150]
                    status = 5
                emit(case)
                k = v = q = qf = ke = ve = fn = None
                torch.cuda.empty_cache()
    return status


if __name__ == "__main__":
    sys.exit(main())
