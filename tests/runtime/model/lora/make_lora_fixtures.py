#!/usr/bin/env python3
"""Writes the LoRA fixtures of tests/runtime/model/lora/: random PEFT adapters for small Llama bases and the
logits those bases give with each adapter MERGED into their weights (W + s * B @ A, s = lora_alpha / r, or
lora_alpha / sqrt(r) with use_rslora, as PEFT's LoraLayer.merge computes it) by an independent float64 NumPy
forward (scripts/make_family_fixtures.py `forward`, written from transformers' modeling code). lattice applies
the same adapters unmerged, in f32, and must reproduce these logits (tests/runtime/model/test_lora.cpp).

Bases: ../shared/golden/tiny-llama2 (MHA 4/4 heads, bf16) and a tiny random Llama written here, `tp3-base`
(6 q / 3 kv heads, ffn 96: divisible by 3, so tp 3 runs). Adapters per base (stored values are exactly those
the reference uses):
  a4   rank 4,  q_proj v_proj,                 alpha 8,  rslora off, F32
  b16  rank 16, all seven projections,         alpha 16, rslora on,  F16
  c8   rank 8,  k_proj o_proj gate_proj down_proj, alpha 4, rslora off, BF16
and b16.gguf: b16 of tiny-llama2 as llama.cpp's convert_lora_to_gguf.py writes it (general.type = adapter,
adapter.lora.alpha (alpha * sqrt(r) for this rsLoRA adapter: llama.cpp scales by alpha / r), blk.N.<name>.weight.
lora_a / lora_b with ne innermost first, q/k B rows permuted into RoPE pair order as the base's q/k rows). Output: <base>/<adapter>/{adapter_config.json, adapter_model.safetensors},
<base>/expected.safetensors (`<adapter>.case<i>` f32 [prompt_len, vocab], `base.case<i>` too) and
<base>/expected.json (prompts). Deterministic; needs numpy only. Usage:
  python3 tests/runtime/model/lora/make_lora_fixtures.py [SHARED_DIR]   (default ../shared)
"""
import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from make_family_fixtures import make_weights, permute_qk  # noqa: E402
from numpy_forward import forward, write_safetensors  # noqa: E402

TARGETS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
ADAPTERS = [  # name, rank, targets, alpha, rslora, dtype
    ("a4", 4, ["q_proj", "v_proj"], 8.0, False, "F32"),
    ("b16", 16, list(TARGETS), 16.0, True, "F16"),
    ("c8", 8, ["k_proj", "o_proj", "gate_proj", "down_proj"], 4.0, False, "BF16"),
]
TP3_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 48,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 3,
    "vocab_size": 96, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
    "max_position_embeddings": 128, "tie_word_embeddings": False, "torch_dtype": "float16", "bos_token_id": 1,
    "eos_token_id": 2,
}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b = data[8 + n + e["data_offsets"][0]: 8 + n + e["data_offsets"][1]]
        if e["dtype"] == "BF16":
            arr = (np.frombuffer(b, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(b, {"F16": np.float16, "F32": np.float32}[e["dtype"]])
        out[name] = arr.reshape(e["shape"])
    return out


def round_to(x, dt):  # the values the file will hold, as float64
    if dt == "F16":
        return x.astype(np.float16).astype(np.float64)
    if dt == "BF16":
        b = (x.astype(np.float32).view(np.uint32) + 0x8000) & 0xFFFF0000  # round half up to bf16
        return b.view(np.float32).astype(np.float64)
    return x.astype(np.float32).astype(np.float64)


def make_adapter(cfg, spec, rng):
    name, r, targets, alpha, rslora, dt = spec
    H, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd = H // cfg["num_attention_heads"]
    dims = {"q_proj": (H, cfg["num_attention_heads"] * hd), "k_proj": (H, cfg["num_key_value_heads"] * hd),
            "v_proj": (H, cfg["num_key_value_heads"] * hd), "o_proj": (cfg["num_attention_heads"] * hd, H),
            "gate_proj": (H, F), "up_proj": (H, F), "down_proj": (F, H)}
    scale = alpha / np.sqrt(r) if rslora else alpha / r
    mats = {}
    for l in range(L):
        for t in targets:
            i, o = dims[t]
            # The delta s * B @ A about a third of the base weight's size (1 / sqrt(in)): it moves the logits.
            a = round_to(rng.standard_normal((r, i)) / np.sqrt(i), dt)
            b = round_to(rng.standard_normal((o, r)) * 0.35 / (scale * np.sqrt(r)), dt)
            mats[(l, t)] = (a, b)
    return {"name": name, "rank": r, "targets": targets, "alpha": alpha, "rslora": rslora, "dtype": dt,
            "scale": scale, "mats": mats}


def write_peft(d, ad):
    os.makedirs(d, exist_ok=True)
    config = {"peft_type": "LORA", "r": ad["rank"], "lora_alpha": ad["alpha"], "use_rslora": ad["rslora"],
              "target_modules": ad["targets"], "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
              "modules_to_save": None, "task_type": "CAUSAL_LM", "base_model_name_or_path": "lattice-tiny"}
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    tensors = {}
    for (l, t), (a, b) in ad["mats"].items():
        p = f"base_model.model.model.layers.{l}.{TARGETS[t]}.{t}."
        tensors[p + "lora_A.weight"] = (ad["dtype"], a)
        tensors[p + "lora_B.weight"] = (ad["dtype"], b)
    write_safetensors(os.path.join(d, "adapter_model.safetensors"), tensors)


GGUF_LORA = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf_lora(path, cfg, ad):
    # GGUF v3 (llama.cpp's gguf.md): header, key-values, tensor infos (ne innermost first), data aligned to 32.
    # llama.cpp scales by alpha / r only: an rsLoRA adapter's twin carries alpha * sqrt(r).
    alpha = ad["alpha"] * np.sqrt(ad["rank"]) if ad["rslora"] else ad["alpha"]
    kvs = [("general.architecture", 8, gguf_str("llama")), ("general.type", 8, gguf_str("adapter")),
           ("adapter.type", 8, gguf_str("lora")), ("adapter.lora.alpha", 6, struct.pack("<f", alpha))]
    tensors = []
    for (l, t), (a, b) in ad["mats"].items():
        if t == "q_proj":
            b = permute_qk(b, cfg["num_attention_heads"])
        if t == "k_proj":
            b = permute_qk(b, cfg["num_key_value_heads"])
        base = f"blk.{l}.{GGUF_LORA[t]}.weight"
        tensors.append((base + ".lora_a", a.astype(np.float16)))
        tensors.append((base + ".lora_b", b.astype(np.float16)))
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, ty, v in kvs:
        out += gguf_str(k) + struct.pack("<I", ty) + v
    offset, blobs = 0, []
    for name, arr in tensors:
        out += gguf_str(name) + struct.pack("<I", 2) + struct.pack("<QQ", arr.shape[1], arr.shape[0])
        out += struct.pack("<IQ", 1, offset)  # F16
        blob = arr.tobytes()
        blob += b"\0" * ((32 - len(blob) % 32) % 32)
        blobs.append(blob)
        offset += len(blob)
    out += b"\0" * ((32 - len(out) % 32) % 32)
    with open(path, "wb") as f:
        f.write(out + b"".join(blobs))


def merged(w, ad):
    m = dict(w)
    for (l, t), (a, b) in ad["mats"].items():
        k = f"model.layers.{l}.{TARGETS[t]}.{t}.weight"
        m[k] = w[k].astype(np.float64) + ad["scale"] * (b @ a)
    return m


def make_base(out, name, cfg, w, prompts, seed):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    logits = {}
    for i, p in enumerate(prompts):
        logits[f"base.case{i}"] = ("F32", forward(cfg, w, p).astype(np.float32))
    for spec in ADAPTERS:
        ad = make_adapter(cfg, spec, rng)
        write_peft(os.path.join(d, ad["name"]), ad)
        if name == "tiny-llama2" and ad["name"] == "b16":
            write_gguf_lora(os.path.join(d, "b16.gguf"), cfg, ad)
        mw = merged(w, ad)
        for i, p in enumerate(prompts):
            logits[f"{ad['name']}.case{i}"] = ("F32", forward(cfg, mw, p).astype(np.float32))
    write_safetensors(os.path.join(d, "expected.safetensors"), logits)
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"prompts": prompts, "adapters": [a[0] for a in ADAPTERS]}, f)


def main():
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared")
    golden = os.path.join(shared, "golden", "tiny-llama2")
    with open(os.path.join(golden, "config.json")) as f:
        cfg = json.load(f)
    w = read_safetensors(os.path.join(golden, "model.safetensors"))
    with open(os.path.join(golden, "expected.json")) as f:
        prompts = [c["prompt_ids"] for c in json.load(f)["cases"]][:2]
    make_base(HERE, "tiny-llama2", cfg, w, prompts, 5401)
    # tp3-base: its own checkpoint (f16 values, as the family fixtures make them).
    d = os.path.join(HERE, "tp3-base")
    os.makedirs(d, exist_ok=True)
    bw = make_weights(TP3_CONFIG, np.random.default_rng(5403))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(TP3_CONFIG, f, indent=1)
    write_safetensors(os.path.join(d, "model.safetensors"), {k: ("F16", v) for k, v in bw.items()})
    rng = np.random.default_rng(5404)
    prompts3 = [[1] + [int(x) for x in rng.integers(3, 96, 17)]]
    make_base(HERE, "tp3-base", TP3_CONFIG, bw, prompts3, 5402)


if __name__ == "__main__":
    main()
