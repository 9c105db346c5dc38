#!/usr/bin/env python3
"""Writes q4_blocks.gguf: GGUF Q4_0 and Q4_1 tensors of random block bytes beside gguf-py's dequantization
of them, the independent reference test_int4_load.cpp checks lattice's 4-bit unpacking against bit for bit.

Tensors (numpy shape [rows, cols]; GGUF ne reversed), all from numpy.random.default_rng(SEED):
  q4_0           Q4_0 [5, 96]   random nibbles; f16 scales of random bits (any sign, subnormals included,
                                inf / NaN excluded) with corner blocks: the largest f16 (65504), the smallest
                                subnormal, -0.0
  q4_0.expected  F32 [5, 96]    gguf.quants.dequantize(q4_0)
  q4_1, q4_1.expected           the same for Q4_1 (random f16 d and m)
Development-time only (CI does not install gguf): pip install gguf numpy, then
  python3 make_q4_fixtures.py tests/runtime/weights/data/q4_blocks.gguf
The file is committed (~4 KB); rerunning with the same gguf version rewrites the same bytes.
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

SEED = 20261205
ROWS, COLS = 5, 96


def random_f16_bits(rng, n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0x3FFF  # no inf / NaN: exponent all ones -> a finite value
    return bits


def blocks(rng, qtype):
    n = ROWS * COLS // 32
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
    return raw.reshape(ROWS, COLS // 32 * (head + 16))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(sys.argv[1], arch="lattice-fixture")
    for name, qtype in (("q4_0", Q.Q4_0), ("q4_1", Q.Q4_1)):
        raw = blocks(rng, qtype)
        expected = gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(ROWS, COLS)
        w.add_tensor(name, raw, raw_dtype=qtype)  # shape from the bytes: [ROWS, COLS] elements
        w.add_tensor(name + ".expected", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
