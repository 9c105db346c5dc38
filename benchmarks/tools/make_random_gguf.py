#!/usr/bin/env python3
"""Writes a GGUF v3 file of a Llama (or Mixtral-style MoE) model with random weights, for side-by-side benchmarks.

Purpose: lattice and llama.cpp both load GGUF, so one file of a given shape (e.g. TinyLlama-1.1B)
lets the two engines be timed on exactly the same weights without downloading a real checkpoint.
The weights are random (normal, std 0.02 by default, norm weights ~1), so the text generated is
meaningless; speed, memory and loading are what the file is for. The tokenizer is real: every
tokenizer.* key is copied from --vocab-from (a vocab-only GGUF such as
shared/tokenizers/ggml-vocab-llama-spm.gguf, the Llama 2 SentencePiece vocab).

Usage:
  make_random_gguf.py --preset tinyllama-1.1b --type q8_0 --seed 1 \
      --vocab-from ../shared/tokenizers/ggml-vocab-llama-spm.gguf --out tinyllama-1.1b.q8_0.gguf
  make_random_gguf.py --preset tiny --type f32 --vocab-from ... --out tiny.gguf    (for tests)
  make_random_gguf.py --preset mixtral-tiny-8x1.1b --type q8_0 ...    (8 experts top 2: lattice's preset
      of the same name, TinyLlama's layers with experts of a quarter of its FFN each)

File layout (all little-endian), as read by llama.cpp's gguf loader and lattice's runtime/weights/gguf.cpp:
  "GGUF" | u32 version=3 | u64 n_tensors | u64 n_kv
  n_kv   x  key (u64 len + utf-8) | u32 value type | value
  n_tensors x name (u64 len + utf-8) | u32 n_dims | u64 ne[n_dims] (innermost first) | u32 ggml type
              | u64 offset (from the start of the data section, a multiple of general.alignment)
  zero padding to general.alignment (32 unless --alignment), then the tensor data, each tensor
  padded to the alignment.
Metadata: general.architecture=llama, general.name, general.alignment, general.file_type
(0 all-f32, 1 mostly-f16, 2 mostly-q4_0, 3 mostly-q4_1, 7 mostly-q8_0), general.quantization_version=2, llama.* hyper-parameters
(context_length, embedding_length, block_count, feed_forward_length, attention.head_count,
attention.head_count_kv, attention.layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count,
vocab_size), then the tokenizer.* keys of --vocab-from copied byte for byte. Its general.* and
llama.* keys are not copied: they describe the vocab file itself (its name, file_type, and the
shape of the model it came from), which this file's own keys replace.
Tensors (llama.cpp names; ne = [in, out] for matrices, so each row of `out` is contiguous):
  token_embd.weight [hidden, vocab]
  blk.N.attn_norm.weight [hidden] f32       blk.N.ffn_norm.weight [hidden] f32
  blk.N.attn_q.weight [hidden, hidden]      blk.N.attn_output.weight [hidden, hidden]
  blk.N.attn_k.weight / attn_v.weight [hidden, kv_heads * head_dim]
  blk.N.ffn_gate.weight / ffn_up.weight [hidden, ffn]   blk.N.ffn_down.weight [ffn, hidden]
  output_norm.weight [hidden] f32           output.weight [hidden, vocab]
A MoE preset (experts > 0) replaces the three ffn_* tensors as current llama.cpp writes Mixtral (still
architecture llama, with llama.expert_count and llama.expert_used_count): the router
blk.N.ffn_gate_inp.weight [hidden, experts] f32, and every expert of a layer in one 3-D tensor,
blk.N.ffn_gate_exps.weight / ffn_up_exps.weight [hidden, ffn, experts], ffn_down_exps.weight
[ffn, hidden, experts] (expert e's rows follow expert e - 1's).
Matrices are stored in --type: f32, f16, or q8_0 (blocks of 32 values along a row: f16 scale
d = max|x| / 127, then 32 int8 q = round(x / d); 34 bytes per block), q4_0 or q4_1 (llama.cpp's
reference quantizers: 18 / 20 bytes per 32 values; the token embedding and the output matrix too). Q/K
rows are random, so llama.cpp's rotary-pair permutation of converted checkpoints has no meaning here.

Random values: tensor i is drawn from numpy.random.Generator(PCG64(SeedSequence(seed,
spawn_key=(i,)))), a stream of its own, generated and written a slab of rows at a time, so memory
stays at a few tens of MB whatever the model size, and files of the same seed and preset but a
different --type hold the same underlying weights (rounded to that type).

Hand-written (Python 3 + numpy only): a benchmark helper should not pull in a GGUF writer package
from Debian or PyPI as a dependency (PyPI's `gguf` exists; this format subset is ~100 lines).
"""
import argparse
import os
import struct
import sys
import time

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types.
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64, T_I64, T_F64 = range(13)
SCALAR_SIZE = {T_U8: 1, T_I8: 1, T_U16: 2, T_I16: 2, T_U32: 4, T_I32: 4, T_F32: 4, T_BOOL: 1,
               T_U64: 8, T_I64: 8, T_F64: 8}

# ggml tensor types used here, and general.file_type (llama_ftype) per --type.
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0 = 0, 1, 2, 3, 8
WEIGHT_TYPES = {"f32": (GGML_F32, 0), "f16": (GGML_F16, 1), "q8_0": (GGML_Q8_0, 7), "q4_0": (GGML_Q4_0, 2),
                "q4_1": (GGML_Q4_1, 3)}
QK8_0 = 32
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (QK8_0,))])  # 34 bytes, unpadded
Q4_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK8_0 // 2,))])  # 18 bytes
Q4_1_BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (QK8_0 // 2,))])  # 20 bytes
BLOCK_TYPES = {GGML_Q8_0: Q8_0_BLOCK, GGML_Q4_0: Q4_0_BLOCK, GGML_Q4_1: Q4_1_BLOCK}

PRESETS = {
    "tinyllama-1.1b": dict(name="TinyLlama-1.1B random", hidden=2048, layers=22, heads=32, kv_heads=4,
                           ffn=5632, vocab=32000, rope_theta=10000.0, rms_eps=1e-5, ctx=2048),
    "tiny": dict(name="tiny-llama random", hidden=64, layers=2, heads=4, kv_heads=2, ffn=128,
                 vocab=32000, rope_theta=10000.0, rms_eps=1e-5, ctx=2048),
    "tiny-moe": dict(name="tiny Mixtral-style random", hidden=64, layers=2, heads=4, kv_heads=2, ffn=64,
                     vocab=32000, rope_theta=1e6, rms_eps=1e-5, ctx=2048, experts=4, experts_used=2),
    # runtime/arch/config.cpp's preset of the same name.
    "mixtral-tiny-8x1.1b": dict(name="Mixtral-style 8x TinyLlama-1.1B random", hidden=2048, layers=22, heads=32,
                                kv_heads=4, ffn=1408, vocab=32000, rope_theta=1e6, rms_eps=1e-5, ctx=2048,
                                experts=8, experts_used=2),
}

SLAB_ELEMS = 1 << 22  # values generated per step (16 MB as f32)


# ---------------------------------------------------------------------------- reading the vocab


def read_vocab_kvs(path):
    """Returns [(key, type, raw value bytes)] of the GGUF at path, plus its tensor count."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != GGUF_MAGIC:
        sys.exit(f"{path}: not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        sys.exit(f"{path}: GGUF version {version} unsupported (2, 3)")

    def skip_value(t, p):
        if t in SCALAR_SIZE:
            return p + SCALAR_SIZE[t]
        if t == T_STRING:
            (n,) = struct.unpack_from("<Q", data, p)
            return p + 8 + n
        if t == T_ARRAY:
            et, n = struct.unpack_from("<IQ", data, p)
            p += 12
            if et in SCALAR_SIZE:
                return p + n * SCALAR_SIZE[et]
            for _ in range(n):
                p = skip_value(et, p)
            return p
        sys.exit(f"{path}: unknown metadata value type {t}")

    kvs, p = [], 24
    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", data, p)
        key = data[p + 8:p + 8 + n].decode("utf-8")
        (t,) = struct.unpack_from("<I", data, p + 8 + n)
        start = p + 12 + n
        p = skip_value(t, start)
        kvs.append((key, t, data[start:p]))
    return kvs, n_tensors


def array_len(raw):
    return struct.unpack_from("<IQ", raw, 0)[1]


# ---------------------------------------------------------------------------- writing


def enc_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, t, value):
    if t == T_STRING:
        raw = enc_str(value)
    else:
        raw = struct.pack("<" + {T_U32: "I", T_F32: "f", T_U64: "Q", T_BOOL: "?"}[t], value)
    return (key, t, raw)


def tensor_nbytes(ggml_type, ne):
    n = int(np.prod(ne))
    if ggml_type == GGML_F32:
        return 4 * n
    if ggml_type == GGML_F16:
        return 2 * n
    assert ne[0] % QK8_0 == 0, f"block types need rows that are a multiple of {QK8_0}, got {ne[0]}"
    return n // QK8_0 * BLOCK_TYPES[ggml_type].itemsize


def quantize_q8_0(x):
    """x: float32 array whose size is a multiple of 32 -> Q8_0 blocks (structured array)."""
    xb = x.reshape(-1, QK8_0)
    d = np.abs(xb).max(axis=1) / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    out = np.empty(xb.shape[0], dtype=Q8_0_BLOCK)
    out["d"] = d.astype(np.float16)
    out["qs"] = np.clip(np.rint(xb * inv[:, None]), -127, 127).astype(np.int8)
    return out


def pack_nibbles(q):
    """q: [blocks, 32] uint8 in 0..15 -> [blocks, 16]: byte i = element i (low nibble) | element 16 + i (high)."""
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def quantize_q4_0(x):
    """llama.cpp's quantize_row_q4_0_ref: d = (the value of largest magnitude) / -8, q = min(15, int(x / d + 8.5))."""
    xb = x.reshape(-1, QK8_0)
    idx = np.abs(xb).argmax(axis=1)
    d = xb[np.arange(xb.shape[0]), idx] / -8.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, (xb * inv[:, None] + 8.5).astype(np.int32)).astype(np.uint8)
    out = np.empty(xb.shape[0], dtype=Q4_0_BLOCK)
    out["d"] = d.astype(np.float16)
    out["qs"] = pack_nibbles(q)
    return out


def quantize_q4_1(x):
    """llama.cpp's quantize_row_q4_1_ref: d = (max - min) / 15, m = min, q = min(15, int((x - min) / d + 0.5))."""
    xb = x.reshape(-1, QK8_0)
    mn, mx = xb.min(axis=1), xb.max(axis=1)
    d = (mx - mn) / 15.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, ((xb - mn[:, None]) * inv[:, None] + 0.5).astype(np.int32)).astype(np.uint8)
    out = np.empty(xb.shape[0], dtype=Q4_1_BLOCK)
    out["d"] = d.astype(np.float16)
    out["m"] = mn.astype(np.float16)
    out["qs"] = pack_nibbles(q)
    return out


def encode(x, ggml_type):
    if ggml_type == GGML_F32:
        return x.astype("<f4", copy=False)
    if ggml_type == GGML_F16:
        return x.astype("<f2")
    if ggml_type == GGML_Q4_0:
        return quantize_q4_0(x)
    if ggml_type == GGML_Q4_1:
        return quantize_q4_1(x)
    return quantize_q8_0(x)


def tensor_plan(p, wtype):
    """[(name, ne, ggml_type, kind)] in file order; kind 'norm' (~1) or 'weight' (~N(0, std))."""
    h, head_dim = p["hidden"], p["hidden"] // p["heads"]
    kv_dim = p["kv_heads"] * head_dim
    plan = [("token_embd.weight", [h, p["vocab"]], wtype, "weight")]
    for i in range(p["layers"]):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", [h], GGML_F32, "norm"),
            (b + "attn_q.weight", [h, h], wtype, "weight"),
            (b + "attn_k.weight", [h, kv_dim], wtype, "weight"),
            (b + "attn_v.weight", [h, kv_dim], wtype, "weight"),
            (b + "attn_output.weight", [h, h], wtype, "weight"),
            (b + "ffn_norm.weight", [h], GGML_F32, "norm"),
        ]
        e = p.get("experts", 0)
        if e:
            plan += [
                (b + "ffn_gate_inp.weight", [h, e], GGML_F32, "weight"),
                (b + "ffn_gate_exps.weight", [h, p["ffn"], e], wtype, "weight"),
                (b + "ffn_up_exps.weight", [h, p["ffn"], e], wtype, "weight"),
                (b + "ffn_down_exps.weight", [p["ffn"], h, e], wtype, "weight"),
            ]
        else:
            plan += [
                (b + "ffn_gate.weight", [h, p["ffn"]], wtype, "weight"),
                (b + "ffn_up.weight", [h, p["ffn"]], wtype, "weight"),
                (b + "ffn_down.weight", [p["ffn"], h], wtype, "weight"),
            ]
    plan += [("output_norm.weight", [h], GGML_F32, "norm"),
             ("output.weight", [h, p["vocab"]], wtype, "weight")]
    return plan


def pad_to(n, align):
    return (n + align - 1) // align * align


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--type", required=True, choices=sorted(WEIGHT_TYPES), help="type of the 2-D weights")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab-from", required=True, help="GGUF whose tokenizer.* keys are copied")
    ap.add_argument("--out", required=True)
    ap.add_argument("--std", type=float, default=0.02, help="std of the random weights (default 0.02)")
    ap.add_argument("--alignment", type=int, default=DEFAULT_ALIGNMENT)
    args = ap.parse_args()
    if args.alignment <= 0 or args.alignment % 8:
        sys.exit("--alignment must be a positive multiple of 8")

    p = dict(PRESETS[args.preset])
    assert p["hidden"] % p["heads"] == 0 and p["heads"] % p["kv_heads"] == 0
    wtype, ftype = WEIGHT_TYPES[args.type]

    vocab_kvs, vocab_tensors = read_vocab_kvs(args.vocab_from)
    copied = [e for e in vocab_kvs if e[0].startswith("tokenizer.")]
    tokens = [e for e in copied if e[0] == "tokenizer.ggml.tokens"]
    if not tokens:
        sys.exit(f"{args.vocab_from}: no tokenizer.ggml.tokens")
    n_vocab = array_len(tokens[0][2])
    if n_vocab != p["vocab"]:
        print(f"note: {args.vocab_from} has {n_vocab} tokens; using that instead of the preset's {p['vocab']}",
              file=sys.stderr)
        p["vocab"] = n_vocab
    if vocab_tensors:
        print(f"note: {args.vocab_from} holds {vocab_tensors} tensors; only its tokenizer.* keys are used",
              file=sys.stderr)

    ours = [
        kv("general.architecture", T_STRING, "llama"),
        kv("general.name", T_STRING, f"{p['name']} ({args.type}, seed {args.seed})"),
        kv("general.description", T_STRING,
           f"random weights (std {args.std}) for benchmarks, written by lattice benchmarks/tools/make_random_gguf.py"),
        kv("general.alignment", T_U32, args.alignment),
        kv("general.file_type", T_U32, ftype),
        kv("general.quantization_version", T_U32, 2),
        kv("llama.context_length", T_U32, p["ctx"]),
        kv("llama.embedding_length", T_U32, p["hidden"]),
        kv("llama.block_count", T_U32, p["layers"]),
        kv("llama.feed_forward_length", T_U32, p["ffn"]),
        kv("llama.attention.head_count", T_U32, p["heads"]),
        kv("llama.attention.head_count_kv", T_U32, p["kv_heads"]),
        kv("llama.attention.layer_norm_rms_epsilon", T_F32, p["rms_eps"]),
        kv("llama.rope.freq_base", T_F32, p["rope_theta"]),
        kv("llama.rope.dimension_count", T_U32, p["hidden"] // p["heads"]),
        kv("llama.vocab_size", T_U32, p["vocab"]),
    ]
    if p.get("experts", 0):
        ours += [kv("llama.expert_count", T_U32, p["experts"]), kv("llama.expert_used_count", T_U32, p["experts_used"])]
    kvs = ours + copied

    plan = tensor_plan(p, wtype)
    offsets, off = [], 0
    for _, ne, t, _ in plan:
        offsets.append(off)
        off = pad_to(off + tensor_nbytes(t, ne), args.alignment)

    header = bytearray(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(plan), len(kvs)))
    for key, t, raw in kvs:
        header += enc_str(key) + struct.pack("<I", t) + raw
    for (name, ne, t, _), o in zip(plan, offsets):
        header += enc_str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        header += struct.pack("<IQ", t, o)
    header += bytes(pad_to(len(header), args.alignment) - len(header))

    t0 = time.time()
    tmp = args.out + ".tmp"
    n_params = 0
    with open(tmp, "wb") as f:
        f.write(header)
        data_start = f.tell()
        for i, ((name, ne, t, kind), o) in enumerate(zip(plan, offsets)):
            assert f.tell() - data_start == o
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(args.seed, spawn_key=(i,))))
            row, n_rows = ne[0], int(np.prod(ne[1:]))
            rows_per_slab = max(1, SLAB_ELEMS // row)
            for r0 in range(0, n_rows, rows_per_slab):
                n = min(rows_per_slab, n_rows - r0) * row
                x = rng.standard_normal(n, dtype=np.float32)
                if kind == "norm":
                    x = 1.0 + np.float32(args.std) * x
                else:
                    x *= np.float32(args.std)
                encode(x, t).tofile(f)
            n_params += row * n_rows
            end = o + tensor_nbytes(t, ne)
            f.write(bytes(pad_to(end, args.alignment) - end))
    os.replace(tmp, args.out)
    size = os.path.getsize(args.out)
    print(f"{args.out}: {args.preset} {args.type} seed {args.seed}: {len(plan)} tensors, {n_params / 1e6:.1f} M params, "
          f"{len(kvs)} keys ({len(copied)} tokenizer.*), {size / 2**20:.1f} MiB, {time.time() - t0:.1f} s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
