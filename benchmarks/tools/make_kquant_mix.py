#!/usr/bin/env python3
"""A GGUF with llama.cpp's Q4_K_M type mix from another GGUF of the same model (its metadata and f32 tensors
copied, every matrix re-typed): Q4_K everywhere, Q6_K for output.weight and for attn_v / ffn_down of the layers
llama.cpp's use_more_bits picks (i < n/8, i >= 7n/8, (i - n/8) % 3 == 2: 10 of 22 for TinyLlama-1.1B). The
matrices' super-blocks are random bytes with small f16 super-block scales (random weights, as the synthetic
files of make_random_gguf.py): a decode benchmark reads the same bytes per token as a llama-quantize Q4_K_M
file of the shape. For benchmarks/bench_int4_decode.py when llama.cpp's llama-quantize is not built.
Usage: make_kquant_mix.py SRC.gguf OUT.gguf [--seed 1]"""
import argparse
import re
import struct

import numpy as np

Q4_K, Q6_K = 12, 14
BLOCK = {0: (4, 1), 1: (2, 1), 8: (34, 32), 2: (18, 32), 3: (20, 32), Q4_K: (144, 256), Q6_K: (210, 256)}
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def get(self, fmt):
        v = struct.unpack_from("<" + fmt, self.d, self.p)
        self.p += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.get("Q")
        self.p += n
        return self.d[self.p - n:self.p].decode()

    def skip(self, t):
        if t == 8:
            self.string()
        elif t == 9:
            et, n = self.get("I"), self.get("Q")
            for _ in range(n):
                self.skip(et)
        else:
            self.get(SCALAR[t])


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def new_type(name, old, n_layers):
    if old in (0, 1) and not name.endswith("embd.weight") and not name.startswith("output."):
        return old  # norms (f32) stay
    m = re.match(r"blk\.(\d+)\.(attn_v|ffn_down)\.weight", name)
    if name == "output.weight" or (m and more_bits(int(m.group(1)), n_layers)):
        return Q6_K
    return Q4_K


def blocks(t, n_blocks, rng):
    bb = BLOCK[t][0]
    v = rng.integers(0, 256, size=(n_blocks, bb), dtype=np.uint8)
    if t == Q4_K:
        v[:, 0:2] = np.frombuffer(np.float16(2e-3).tobytes(), np.uint8)
        v[:, 2:4] = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    else:
        v[:, 208:210] = np.frombuffer(np.float16(2e-4).tobytes(), np.uint8)
    return v.tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    data = open(a.src, "rb").read()
    r = Reader(data)
    assert data[:4] == b"GGUF"
    r.p = 4
    version, n_tensors, n_kv = r.get("I"), r.get("Q"), r.get("Q")
    kv_start, align = r.p, 32
    n_layers = 0
    for _ in range(n_kv):
        key = r.string()
        t = r.get("I")
        if key == "general.alignment":
            align = r.get("I")
        elif key.endswith(".block_count"):
            n_layers = r.get(SCALAR[t])
        else:
            r.skip(t)
    kv_bytes = data[kv_start:r.p]
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.get("Q") for _ in range(r.get("I"))]
        t, off = r.get("I"), r.get("Q")
        tensors.append((name, dims, t, off))
    data_start = (r.p + align - 1) // align * align
    out_infos, chunks, off = b"", [], 0
    for name, dims, t, src_off in tensors:
        n = int(np.prod(dims))
        nt = new_type(name, t, n_layers)
        size = n // BLOCK[nt][1] * BLOCK[nt][0]
        out_infos += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(dims))
        out_infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", nt, off)
        chunk = data[data_start + src_off:data_start + src_off + size] if nt == t else blocks(nt, n // 256, rng)
        pad = (size + align - 1) // align * align - size
        chunks.append(chunk + b"\0" * pad)
        off += size + pad
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kv_bytes + out_infos
    head += b"\0" * ((len(head) + align - 1) // align * align - len(head))
    with open(a.out, "wb") as f:
        f.write(head)
        for c in chunks:
            f.write(c)


if __name__ == "__main__":
    main()
