#!/usr/bin/env python3
"""Writes q4_blocks.gguf: a one-layer llama GGUF whose linears are Q4_0 (q, k, v, o) and Q4_1 (gate, up, down)
blocks of random bytes, each beside gguf-py's dequantization of it, the independent reference
test_int4_blocks.cpp checks lattice's 4-bit reads (GgufSource::read_int4, then the kernels' packed layout
read back) and its f32 reads against, bit for bit.

Model: hidden 32, ffn 64, 1 layer, 1 head of 32 (and 1 kv head), vocab 8, rms eps 1e-5; token_embd and the
norms f32. Block bytes from numpy.random.default_rng(SEED): random nibbles; f16 scales (and Q4_1 minimums) of
random bits (any sign, subnormals included, inf / NaN excluded), with corner blocks: the largest f16 (65504),
the smallest subnormal, -0.0, a minimum of -65504, nibbles 0 and 15.
Each linear "blk.0.X.weight" has "blk.0.X.weight.expected" (F32, same shape) = gguf.quants.dequantize of its
bytes, in the file's row order (the test un-permutes q/k rows as llama.cpp's converter permuted them).
Development-time only (CI does not install gguf): pip install gguf numpy, then
  python3 make_q4_fixtures.py tests/runtime/weights/data/q4_blocks.gguf
The file is committed (~50 KB); rerunning with the same gguf version rewrites the same bytes.
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

SEED = 20261205
H, F, V = 32, 64, 8


def random_f16_bits(rng, n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0x3FFF  # no inf / NaN: exponent all ones -> a finite value
    return bits


def blocks(rng, qtype, rows, cols):
    n = rows * cols // 32
    head = 2 if qtype == Q.Q4_0 else 4
    raw = np.zeros((n, head + 16), dtype=np.uint8)
    raw[:, head:] = rng.integers(0, 256, size=(n, 16), dtype=np.uint32).astype(np.uint8)
    d = random_f16_bits(rng, n)
    d[0], d[1], d[2] = 0x7BFF, 0x0001, 0x8000  # 65504, smallest subnormal, -0.0
    raw[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    if qtype == Q.Q4_1:
        m = random_f16_bits(rng, n)
        m[3] = 0xFBFF  # -65504
        raw[:, 2:4] = m.view(np.uint8).reshape(n, 2)
    raw[0, head] = 0xF0  # nibbles 0 and 15
    return raw.reshape(rows, cols // 32 * (head + 16))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(sys.argv[1], arch="llama")
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_block_count(1)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tensor("token_embd.weight", rng.standard_normal((V, H)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(H, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(H, dtype=np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(H, dtype=np.float32))
    linears = [("attn_q", Q.Q4_0, H, H), ("attn_k", Q.Q4_0, H, H), ("attn_v", Q.Q4_0, H, H),
               ("attn_output", Q.Q4_0, H, H), ("ffn_gate", Q.Q4_1, F, H), ("ffn_up", Q.Q4_1, F, H),
               ("ffn_down", Q.Q4_1, H, F)]
    for name, qtype, rows, cols in linears:
        raw = blocks(rng, qtype, rows, cols)
        expected = gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(rows, cols)
        w.add_tensor(f"blk.0.{name}.weight", raw, raw_dtype=qtype)  # shape from the bytes: [rows, cols] elements
        w.add_tensor(f"blk.0.{name}.weight.expected", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
