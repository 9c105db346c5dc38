#!/usr/bin/env python3
"""Writes tiny AWQ and GPTQ checkpoints and their NumPy dequantization, the independent reference the 4-bit
HF loading tests (test_int4_hf.cpp, test_int4_layouts.cpp) check lattice against, bit for bit.

Model (llama): hidden 64, intermediate 64, 1 layer, 2 heads of 32 (2 kv heads), vocab 48, untied f16
embedding and LM head, f16 norms (random around 1). Each linear W [n, k] (y = x W^T) gets random 4-bit
q (0..15), zero points and f16 scales (positive, 0.004..0.04) from numpy.random.default_rng(SEED), packed as:
  tiny-awq   AutoAWQ "gemm": qweight i32 [k, n / 8], qzeros i32 [k / G, n / 8], the 8 output channels of an
             int32 at nibbles [0, 2, 4, 6, 1, 3, 5, 7] (channel 8j + order[i] at bits 4i), scales f16 [k / G, n];
             G = 32, zero points 0..15; w = (q - z) * s
  tiny-gptq  AutoGPTQ v1 ("checkpoint_format": "gptq"), desc_act (act-order): qweight i32 [k / 8, n] (input
             channel 8i + j at bits 4j), qzeros i32 [k / G, n / 8] (channel 8j + i at bits 4i) storing z - 1,
             scales f16 [k / G, n], g_idx i32 [k] a random assignment of G channels to each group (one for q, k,
             v, one for gate, up: linears of one input share it, as GPTQ's act-order gives them), an all-zero
             f16 bias per linear (as AutoGPTQ writes); G = 32; w = (q - (stored + 1)) * s[g_idx[k]], so a
             stored 15 reads as 16, as AutoGPTQ and exllama read it
and "<name>-ref": the same model with every linear as f32 = that formula evaluated in NumPy (float32),
without quantization_config (an ordinary float checkpoint).
Development-time only: python3 make_awq_gptq_fixtures.py tests/runtime/weights/data   (numpy; ~250 KB)
Rerunning writes the same bytes.
"""
import json
import os
import struct
import sys

import numpy as np

SEED = 20261206
H, F, V, G = 64, 64, 48, 32
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
LINEARS = [("self_attn.q_proj", H, H), ("self_attn.k_proj", H, H), ("self_attn.v_proj", H, H),
           ("self_attn.o_proj", H, H), ("mlp.gate_proj", F, H), ("mlp.up_proj", F, H), ("mlp.down_proj", H, F)]


def write_safetensors(path, tensors):
    """tensors: [(name, np.ndarray)] in order; dtypes f16 / f32 / i32."""
    names = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors:
        a = np.ascontiguousarray(a)
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def config(quant):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": H,
         "intermediate_size": F, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
         "vocab_size": V, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "max_position_embeddings": 64,
         "tie_word_embeddings": False, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2}
    if quant:
        c["quantization_config"] = quant
    return c


def pack_along(values, axis_order):
    """values: uint [..., 8m] -> int32 [..., m]: element 8j + axis_order[i] at bits 4i."""
    v = values.reshape(values.shape[:-1] + (-1, 8)).astype(np.uint32)
    out = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i, o in enumerate(axis_order):
        out |= (v[..., o] & 15) << np.uint32(4 * i)
    return out.view(np.int32)


def make(out_dir, method, rng):
    common = [("model.embed_tokens.weight", (rng.standard_normal((V, H)) * 0.5).astype(np.float16)),
              ("model.norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float16)),
              ("model.layers.0.input_layernorm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float16)),
              ("model.layers.0.post_attention_layernorm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float16)),
              ("lm_head.weight", (rng.standard_normal((V, H)) * 0.1).astype(np.float16))]
    quant, ref = list(common), list(common)
    # act-order: linears that read the same input (q | k | v, gate | up) share one order, as GPTQ gives them
    # (one input Hessian); o_proj and down_proj have their own.
    orders = {}
    for name, n, k in LINEARS:
        key = {"self_attn.k_proj": "self_attn.q_proj", "self_attn.v_proj": "self_attn.q_proj",
               "mlp.up_proj": "mlp.gate_proj"}.get(name, name)
        if key not in orders:
            orders[key] = np.empty(k, dtype=np.int32)
            orders[key][rng.permutation(k)] = np.arange(k) // G  # G random channels per group
        shared_g_idx = orders[key]
        p = "model.layers.0." + name
        groups = k // G
        q = rng.integers(0, 16, size=(k, n), dtype=np.uint32)           # [input channel, output channel]
        stored = rng.integers(0, 16, size=(groups, n), dtype=np.uint32)  # zero points as written in the file
        s = rng.uniform(0.004, 0.04, size=(groups, n)).astype(np.float16)
        if method == "awq":
            g_idx = np.arange(k) // G
            z = stored.astype(np.int64)
            quant += [(p + ".qweight", pack_along(q, AWQ_ORDER)), (p + ".qzeros", pack_along(stored, AWQ_ORDER)),
                      (p + ".scales", s)]
        else:
            g_idx = shared_g_idx
            z = stored.astype(np.int64) + 1  # v1 files store z - 1
            qweight = pack_along(q.T, list(range(8))).T        # [k / 8, n]: input channel 8i + j at bits 4j
            quant += [(p + ".qweight", np.ascontiguousarray(qweight)),
                      (p + ".qzeros", pack_along(stored, list(range(8)))), (p + ".scales", s),
                      (p + ".g_idx", g_idx.astype(np.int32)), (p + ".bias", np.zeros(n, dtype=np.float16))]
        # Reference: w[n, k] = (q[k, n] - z[g(k), n]) * s[g(k), n], float32.
        w = ((q.astype(np.int64) - z[g_idx, :]).astype(np.float32) * s[g_idx, :].astype(np.float32)).T
        ref.append((p + ".weight", np.ascontiguousarray(w.astype(np.float32))))
    qcfg = ({"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": True, "version": "gemm"}
            if method == "awq" else
            {"quant_method": "gptq", "bits": 4, "group_size": G, "desc_act": True, "sym": False,
             "checkpoint_format": "gptq"})
    for folder, cfg, tensors in ((out_dir, qcfg, quant), (out_dir + "-ref", None, ref)):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config(cfg), f, indent=2)
            f.write("\n")
        write_safetensors(os.path.join(folder, "model.safetensors"), tensors)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rng = np.random.default_rng(SEED)
    make(os.path.join(sys.argv[1], "tiny-awq"), "awq", rng)
    make(os.path.join(sys.argv[1], "tiny-gptq"), "gptq", rng)


if __name__ == "__main__":
    main()
