#!/usr/bin/env python3
"""ref-dequant.py — tensors of a GGUF dequantized by the `gguf` package.

    scripts/ref-dequant.py MODEL.gguf OUTDIR TENSOR...

Writes OUTDIR/TENSOR.f32 (float32, ggml order: ne[0] fastest) for each
tensor, with gguf.quants.dequantize: the independent reference that
`test_gguf --dequant` compares tqkv-run's dequantizers with (bit-exact).
Exit 77 when numpy or gguf is missing.
"""
import os
import sys

try:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
except ImportError as e:
    print(f"ref-dequant.py: {e} (pip install numpy gguf)", file=sys.stderr)
    sys.exit(77)

if len(sys.argv) < 4:
    sys.exit(__doc__)
r = GGUFReader(sys.argv[1])
tensors = {t.name: t for t in r.tensors}
os.makedirs(sys.argv[2], exist_ok=True)
for name in sys.argv[3:]:
    t = tensors[name]
    x = dequantize(t.data, t.tensor_type).astype(np.float32)
    x.tofile(os.path.join(sys.argv[2], name + ".f32"))
    print(f"{name}: {t.tensor_type.name} {list(t.shape)} sum {float(x.astype(np.float64).sum()):.6f}")
