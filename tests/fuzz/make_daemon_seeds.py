#!/usr/bin/env python3
"""Seeds of the fuzz targets sqe, rpc, hello and spillhdr (tests/fuzz/seeds/):
well-formed inputs each target's header comment describes, so mutations start
from bytes the checks accept.  Run from the repository root."""
import os, struct, zlib

def put(target, name, data):
    d = f"tests/fuzz/seeds/{target}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/{name}", "wb") as f:
        f.write(data)

# ---- sqe: 16 bytes of state, then 128-byte SQEs ----
def sqe(op, dtype=0, flags=0, layer=0, session=7, n_tokens=0, n_q=0, k=0, v=0, q=0, pos=0, out=0, tpos=0):
    return struct.pack("<BBHIQQIIQQQQQQ6Q", op, dtype, flags, layer, 1, session, n_tokens, n_q,
                       k, v, q, pos, out, tpos, *([0] * 6))
# arena 64 KiB; 4 layers, 2 KV heads, group 2, head_dim 64, q8/tq4, attached
state = struct.pack("<I", 65536) + bytes([3, 0, 1, 1, 8, 1, 5, 1]) + bytes(4)
put("sqe", "ops", state + sqe(0, session=0) + sqe(1, flags=1) + sqe(3, n_tokens=4, k=0, v=4096)
    + sqe(4, n_q=2, q=8192, pos=12288, out=16384) + sqe(5, dtype=1, n_tokens=2, n_q=1, k=0, v=2048, q=4096, pos=8192, out=12288)
    + sqe(6, layer=3, tpos=5) + sqe(6, flags=2) + sqe(8) + sqe(2) + sqe(7))
put("sqe", "edges", state + sqe(3, n_tokens=128, k=0, v=32768) + sqe(3, n_tokens=129, k=0, v=32768)
    + sqe(4, dtype=2, n_q=1, q=65536 - 512, pos=65532, out=65536 - 1024) + sqe(4, dtype=3, n_q=1) + sqe(9))
big = struct.pack("<I", 0x80000000 | (1 << 30)) + bytes([0, 0, 7, 3, 64, 1, 1, 1]) + bytes(4)
put("sqe", "huge_arena", big + sqe(3, n_tokens=65536, k=0, v=1 << 30) + sqe(4, n_q=65536, q=0, pos=1 << 31, out=1 << 32))
put("sqe", "detached", state[:11] + b"\0" + state[12:] + sqe(3, n_tokens=1) + sqe(1))

# ---- rpc: method byte, then the request's protobuf bytes ----
def varint(x):
    b = b""
    while True:
        c = x & 0x7f; x >>= 7
        b += bytes([c | (0x80 if x else 0)])
        if not x: return b
def fv(n, x): return varint(n << 3) + varint(x)
def fs(n, s): return varint(n << 3 | 2) + varint(len(s)) + s
put("rpc", "open", bytes([2]) + fs(1, b"default") + fs(2, b"chat-1") + fv(3, 32) + fv(4, 8) + fv(5, 32)
    + fv(6, 128) + fs(7, b"q8") + fs(8, b"tq4") + fv(9, 4096) + fv(10, 1) + fv(11, 42) + fs(15, b"k-center+v-center"))
put("rpc", "open_attached", bytes([2]) + fs(1, b"big") + fv(3, 2) + fv(4, 1) + fv(5, 1) + fv(6, 64)
    + fv(9, 100) + fv(12, 3) + fv(13, 1) + fv(14, 1) + fs(15, b"default"))
put("rpc", "open_nul", bytes([2]) + fs(1, b"prod\0x") + fv(3, 2))
put("rpc", "session_ref", bytes([3]) + fv(1, 5))
put("rpc", "spill", bytes([10]) + fv(1, 5) + fv(2, 1 << 20))
put("rpc", "list", bytes([5]) + fs(1, b"default"))
put("rpc", "budget", bytes([8]) + fs(1, b"default") + fv(2, 1) + fv(3, 1 << 30) + fv(4, 1) + fv(5, 1 << 20))
put("rpc", "health", bytes([0]))

# ---- hello: 16 bytes of what came with it, then the message ----
def layout(sq, cq, arena):
    cq_off = 4096 + sq * 128
    arena_off = (cq_off + cq * 32 + 4095) & ~4095
    return arena_off + ((arena + 4095) & ~4095)
def hello(sq, cq, arena, total=None, magic=0x474e49525f564b51, version=(1 << 16) | 3):
    return struct.pack("<QIIIIQQ3Q", magic, version, 0, sq, cq, arena, layout(sq, cq, arena) if total is None else total, 0, 0, 0)
meta = bytes([1, 0x06, 0]) + bytes(13)          # one fd, regular, sealed shrink|grow
put("hello", "ok", meta + hello(64, 128, 1 << 20))
put("hello", "max", meta + hello(4096, 8192, 1 << 32))
put("hello", "bad_total", meta + hello(1, 1, 1, total=8192))
put("hello", "unsealed", bytes([1, 0x01, 1]) + bytes(5) + struct.pack("<Q", 1 << 20) + hello(8, 8, 4096))

# ---- spillhdr: flags, bit to flip, 80-byte header, payload ----
def crc32c(data, crc=0):
    crc ^= 0xffffffff
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xffffffff
def spill_hdr(payload, sess=9, gen=3, layer=1, page=2, layout_id=1):
    h = struct.pack("<QIIIIQQQIIIBBHI3I", 0x314c5053564b5154, 1, 4096, layout_id, len(payload), sess, gen, 0xabcdef,
                    layer, page, 16, 1, 5, 0, 0, 0, 0, 0)
    c = crc32c(payload, crc32c(h))
    return h[:64] + struct.pack("<I", c) + h[68:]
pl = bytes(range(256)) * 4
put("spillhdr", "sealed", bytes([0, 7, 1]) + spill_hdr(pl) + pl)
put("spillhdr", "wrong_page", bytes([8, 0, 0]) + spill_hdr(pl) + pl)
put("spillhdr", "seal_first", bytes([1, 0, 0]) + bytes(80) + pl[:64])
put("spillhdr", "empty_payload", bytes([0, 0, 0]) + spill_hdr(b""))
