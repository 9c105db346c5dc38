#!/usr/bin/env python3
"""A Hugging Face Llama checkpoint of random weights: config.json + model.safetensors (bf16, f16 or
f32), written tensor by tensor (the header first, with every offset), so a 1.1B model needs memory
for one tensor, not the model. Matrices are uniform in [-1, 1] / sqrt(cols) (activations stay O(1)),
norms 1 + small noise. Shapes: the TinyLlama-1.1B preset (lattice's `tinyllama-1.1b`) or --small
(a few MB, for smoke tests). Needs numpy.
Usage: make_random_hf.py --out DIR [--shape tinyllama-1.1b|small] [--dtype bf16|f16|f32] [--seed 1]"""
import argparse
import json
import os
import struct

import numpy as np

SHAPES = {
    "tinyllama-1.1b": dict(hidden=2048, ffn=5632, layers=22, heads=32, kv=4, vocab=32000, max_pos=2048),
    "small": dict(hidden=256, ffn=704, layers=4, heads=8, kv=2, vocab=1024, max_pos=512),
}


def tensors(s):
    h, hd = s["hidden"], s["hidden"] // s["heads"]
    out = [("model.embed_tokens.weight", (s["vocab"], h))]
    for l in range(s["layers"]):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (s["heads"] * hd, h)),
                (p + "self_attn.k_proj.weight", (s["kv"] * hd, h)),
                (p + "self_attn.v_proj.weight", (s["kv"] * hd, h)),
                (p + "self_attn.o_proj.weight", (h, s["heads"] * hd)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (s["ffn"], h)),
                (p + "mlp.up_proj.weight", (s["ffn"], h)),
                (p + "mlp.down_proj.weight", (h, s["ffn"]))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (s["vocab"], h))]


def encode(x, dtype):
    if dtype == "f32":
        return x.astype("<f4").tobytes()
    if dtype == "f16":
        return x.astype("<f2").tobytes()
    u = x.astype(np.float32).view(np.uint32)  # bf16: round to nearest even
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="tinyllama-1.1b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    s = SHAPES[a.shape]
    os.makedirs(a.out, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "hidden_size": s["hidden"], "intermediate_size": s["ffn"], "num_hidden_layers": s["layers"],
              "num_attention_heads": s["heads"], "num_key_value_heads": s["kv"], "vocab_size": s["vocab"],
              "max_position_embeddings": s["max_pos"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
              "torch_dtype": {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[a.dtype]}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    es = 4 if a.dtype == "f32" else 2
    tag = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[a.dtype]
    header, off = {}, 0
    for name, shape in tensors(s):
        n = int(np.prod(shape)) * es
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    rng = np.random.default_rng(a.seed)
    path = os.path.join(a.out, "model.safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shape in tensors(s):
            if len(shape) == 1:
                x = 1.0 + 0.05 * rng.standard_normal(shape, dtype=np.float32)
            else:
                x = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32) / np.float32(np.sqrt(shape[1]))
            f.write(encode(x, a.dtype))
    os.replace(path + ".tmp", path)
    print(f"{a.out}: {a.shape} {a.dtype}, {off / 2**30:.2f} GiB of weights")


if __name__ == "__main__":
    main()
