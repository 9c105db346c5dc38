#!/usr/bin/env python3
"""Writes kquant_blocks.gguf: a one-layer llama GGUF of K-quant (and Q5_0 / Q5_1) blocks of random bytes,
beside gguf-py's dequantization of each K-quant tensor, the independent reference test_kquant_blocks.cpp checks
lattice's f32 reads against bit for bit, and its 4-bit repack of Q4_K (GgufSource::read_int4) against within
the repack's f16 rounding of the scales (runtime/weights/dequant.h).

Model: hidden 256 (rows of whole 256-element super-blocks), 2 heads and 1 kv head of 16 (key_length 16), ffn
32, vocab 8, rms eps 1e-5, f32 norms. Types as a llama.cpp Q4_K_M file mixes them: token_embd, attn_q,
ffn_gate, ffn_up Q4_K; attn_k Q5_K; attn_v and output Q6_K; attn_output Q5_0 and ffn_down Q5_1 (their 32
columns are not a multiple of 256: llama.cpp's fallback types). Scales are in a sane range so that the model
runs (the test's forward); the 6-bit scales / minimums, Q6_K's int8 scales and every quant bit are uniformly
random (all values reached), and sub-block 0 of every Q4_K super-block gets a power-of-two (or zero) scale and
minimum, where the repack is exact.
Corner tensors "corner.<type>" (not part of the model; the test reads them by their GGUF name) cover the f16
scale space: random bits (any sign, subnormals; inf / NaN excluded), 65504, -65504, the smallest subnormal,
-0.0, for d and for the minimum (dmin, m).
Each checked tensor X has "X.expected" (F32, same shape) = gguf.quants.dequantize of its bytes, in the file's
row order (the test un-permutes attn_q / attn_k rows as llama.cpp's converter permuted them).
Development-time only (CI does not install gguf): pip install gguf numpy, then
  python3 make_kquant_fixtures.py tests/runtime/weights/data/kquant_blocks.gguf
The file is committed (~220 KB); rerunning with the same gguf version rewrites the same bytes.
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

SEED = 20261206
H, HEADS, KV, HD, F, V = 256, 2, 1, 16, 32, 8
BLOCK_BYTES = {Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210, Q.Q5_0: 22, Q.Q5_1: 24}
BLOCK_ELEMS = {Q.Q4_K: 256, Q.Q5_K: 256, Q.Q6_K: 256, Q.Q5_0: 32, Q.Q5_1: 32}


def f16_bits(values):
    return np.asarray(values, dtype=np.float16).view(np.uint16)


def random_f16_bits(rng, n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0x3FFF  # no inf / NaN: exponent all ones -> a finite value
    return bits


def pack_scales(sc, mn):
    """The 12 packed bytes of eight 6-bit scales and minimums (the inverse of gguf-py's Q4_K.get_scale_min)."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    for j in range(4):
        out[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        out[:, j + 4] = (mn[:, j] & 63) | ((mn[:, j + 4] >> 4) << 6)
        out[:, j + 8] = (sc[:, j + 4] & 15) | ((mn[:, j + 4] & 15) << 4)
    got_sc, got_mn = gguf.quants.Q4_K.get_scale_min(out)
    assert (got_sc == sc).all() and (got_mn == mn).all()
    return out


def blocks(rng, qtype, rows, cols, d_bits=None, m_bits=None, exact_first=False):
    """Random blocks of a [rows, cols] tensor; d_bits / m_bits (f16 bit patterns, one per block) or sane ones."""
    n = rows * cols // BLOCK_ELEMS[qtype]
    raw = rng.integers(0, 256, size=(n, BLOCK_BYTES[qtype]), dtype=np.uint32).astype(np.uint8)
    if d_bits is None:
        lo, hi = {Q.Q4_K: (2e-4, 2e-3), Q.Q5_K: (1e-4, 1e-3), Q.Q6_K: (2e-5, 2e-4), Q.Q5_0: (2e-3, 2e-2),
                  Q.Q5_1: (2e-3, 2e-2)}[qtype]
        d_bits = f16_bits(rng.uniform(lo, hi, size=n))
        m_bits = f16_bits(rng.uniform(lo, hi, size=n) * (1 if qtype in (Q.Q4_K, Q.Q5_K) else -8))
    if qtype in (Q.Q4_K, Q.Q5_K):
        sc = rng.integers(0, 64, size=(n, 8), dtype=np.uint32).astype(np.uint8)
        mn = rng.integers(0, 64, size=(n, 8), dtype=np.uint32).astype(np.uint8)
        if exact_first:  # sub-block 0: scale a power of two, minimum zero or a power of two
            sc[:, 0] = 1 << rng.integers(0, 6, size=n)
            mn[:, 0] = np.where(rng.integers(0, 2, size=n) == 0, 0, 1 << rng.integers(0, 6, size=n))
        raw[:, 4:16] = pack_scales(sc, mn)
    if qtype == Q.Q6_K:
        raw[:, 208:210] = d_bits.view(np.uint8).reshape(n, 2)
    else:
        raw[:, 0:2] = d_bits.view(np.uint8).reshape(n, 2)
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q5_1):
        raw[:, 2:4] = m_bits.view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // BLOCK_ELEMS[qtype] * BLOCK_BYTES[qtype])


def corner_scales(rng, n):
    d, m = random_f16_bits(rng, n), random_f16_bits(rng, n)
    d[:4] = [0x7BFF, 0xFBFF, 0x0001, 0x8000]  # 65504, -65504, smallest subnormal, -0.0
    m[4:8] = [0x7BFF, 0xFBFF, 0x0001, 0x8000]
    d[4:8] = f16_bits([1e-3, -2e-3, 3e-3, 5e-4])  # beside a corner minimum, a d that keeps the product in f16
    return d, m


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(sys.argv[1], arch="llama")
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_block_count(1)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_layer_norm_rms_eps(1e-5)

    def add(name, qtype, rows, cols, expected=True, **kw):
        raw = blocks(rng, qtype, rows, cols, **kw)
        w.add_tensor(name, raw, raw_dtype=qtype)  # shape from the bytes: [rows, cols] elements
        if expected:
            want = gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(rows, cols)
            assert np.isfinite(want).all()
            w.add_tensor(name + ".expected", want)

    add("token_embd.weight", Q.Q4_K, V, H, exact_first=True)
    add("output.weight", Q.Q6_K, V, H)
    norm = (1.0 + 0.01 * (np.arange(H) % 13)).astype(np.float32)
    w.add_tensor("output_norm.weight", norm)
    w.add_tensor("blk.0.attn_norm.weight", norm)
    w.add_tensor("blk.0.ffn_norm.weight", norm)
    add("blk.0.attn_q.weight", Q.Q4_K, HEADS * HD, H, exact_first=True)
    add("blk.0.attn_k.weight", Q.Q5_K, KV * HD, H)
    add("blk.0.attn_v.weight", Q.Q6_K, KV * HD, H)
    add("blk.0.attn_output.weight", Q.Q5_0, H, HEADS * HD, expected=False)
    add("blk.0.ffn_gate.weight", Q.Q4_K, F, H, exact_first=True)
    add("blk.0.ffn_up.weight", Q.Q4_K, F, H, exact_first=True)
    add("blk.0.ffn_down.weight", Q.Q5_1, H, F, expected=False)
    # Corners: 8 blocks each, the first eight scales of corner_scales.
    for qtype, name, rows, cols in [(Q.Q4_K, "q4_K", 2, 1024), (Q.Q5_K, "q5_K", 2, 1024),
                                    (Q.Q6_K, "q6_K", 2, 1024), (Q.Q5_0, "q5_0", 4, 64), (Q.Q5_1, "q5_1", 4, 64)]:
        d, m = corner_scales(rng, 8)
        add(f"corner.{name}", qtype, rows, cols, d_bits=d, m_bits=m)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
