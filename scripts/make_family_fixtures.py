#!/usr/bin/env python3
"""Writes the model-family fixtures of tests/runtime/model/families/ on Llama's skeleton: a tiny random
checkpoint per family (Qwen2, Qwen2 with its window, Mistral, Mixtral), as Hugging Face safetensors +
config.json and as the same weights in a GGUF written with gguf-py the way llama.cpp's converter lays that
family out, plus the reference logits of every prompt position and 24 greedy tokens from the independent
float64 NumPy forward of scripts/numpy_forward.py (written from transformers' modeling code, not from
lattice's). What each family exercises there:

  Qwen2ForCausalLM (modeling_qwen2.py): q/k/v biases (large, k especially, so they matter), rope_theta 1e6;
  its window is named but off (use_sliding_window false), as Qwen2.5 configs ship.
  Qwen2 with use_sliding_window (configuration_qwen2.py layer_types): a window of 5 in the layers
  i >= max_window_layers only ("sliding_attention"), full attention below (the qwen2-swa fixture).
  MistralForCausalLM (modeling_mistral.py): no biases, a sliding window of 6 in every layer, shorter than
  the prompts; the 40-token prompt crosses a 32-position tile of lattice's CPU attention.
  MixtralForCausalLM (modeling_mixtral.py, MixtralSparseMoeBlock): 4 experts, top 2, renormalized.
  Its GGUF is written as llama.cpp's converter writes Mixtral: architecture "llama" with
  llama.expert_count / expert_used_count, q/k rows permuted into RoPE pair order, and each layer's
  experts stacked into one 3-D ffn_{gate,up,down}_exps tensor.

Weights are float16 values (stored F16 in both files; GGUF norms and biases F32, as llama.cpp keeps
1-D tensors), so both files hold exactly the values the float64 reference used. Output per family
folder (the format of ../shared/golden, read by tests/runtime/model/golden.h):
  config.json, model.safetensors, model.gguf, expected.json (cases[i].prompt_ids, greedy_ids,
  min_greedy_margin), expected.safetensors (case{i}.logits f32 [prompt_len, vocab]).
Deterministic (fixed seeds): rerunning it rewrites these files byte for byte. Needs numpy and gguf
(pip install numpy gguf), never torch. Usage:
  python3 scripts/make_family_fixtures.py [OUT_DIR]   (default tests/runtime/model/families)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_forward import write_fixture  # noqa: E402

N_NEW = 24


def qwen2_spec():
    return {
        "gguf": True,
        "name": "qwen2",
        "seed": 20261204,
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_act": "silu",
            "hidden_size": 48,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 128,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "max_position_embeddings": 128,
            "sliding_window": 64,  # named but off (use_sliding_window false), as Qwen2.5 configs ship
            "use_sliding_window": False,
            "tie_word_embeddings": False,
            "torch_dtype": "float16",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        "prompts": [[1, 17, 90, 3, 44, 101, 7, 63], [1, 40, 41, 42, 43]],
    }


def qwen2_swa_spec():
    # Qwen2 with its window switched on: layer 0 full attention, layer 1 (>= max_window_layers) a
    # window of 5 positions, shorter than both prompts. No GGUF: llama.cpp's qwen2 has no window.
    spec = qwen2_spec()
    spec.update(name="qwen2-swa", seed=20261229, gguf=False,  # the seed of 40 with the widest greedy margin
                prompts=[[1, 9, 80, 33, 4, 120, 61, 18, 99, 2, 47, 70], [1, 40, 41, 42, 43, 44, 45]])
    spec["config"] = dict(spec["config"], sliding_window=5, use_sliding_window=True, max_window_layers=1)
    return spec


def mistral_spec():
    # Llama's tensors plus a sliding window shorter than the prompts (transformers' MistralForCausalLM:
    # the query at i attends keys i - W < j <= i); the 40-token prompt and its continuation cross a
    # 32-position tile of lattice's CPU attention, so windows that skip whole tiles are covered too.
    # No GGUF: llama.cpp writes Mistral as architecture "llama", which has no window.
    rng = np.random.default_rng(7)
    return {
        "name": "mistral",
        "seed": 20261213,
        "gguf": False,
        "config": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "hidden_act": "silu",
            "hidden_size": 48,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 128,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "rope_scaling": None,
            "max_position_embeddings": 128,
            "sliding_window": 6,
            "tie_word_embeddings": False,
            "torch_dtype": "float16",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        "prompts": [[1] + [int(x) for x in rng.integers(3, 128, 39)], [1, 9, 33, 70, 12, 99, 4, 51, 18, 77, 23, 64]],
    }


def mixtral_spec():
    # 4 experts, top 2 (the tiny Mixtral), GQA; no window (Mixtral configs ship null).
    rng = np.random.default_rng(11)
    return {
        "name": "mixtral",
        "seed": 20261382,  # the seed of 300 whose router and greedy margins are widest
        "gguf": True,
        "config": {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "hidden_act": "silu",
            "hidden_size": 64,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "vocab_size": 128,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "max_position_embeddings": 128,
            "sliding_window": None,
            "router_aux_loss_coef": 0.02,
            "output_router_logits": False,
            "tie_word_embeddings": False,
            "torch_dtype": "float16",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        "prompts": [[1] + [int(x) for x in rng.integers(3, 128, 15)], [1, 5, 88, 31, 120, 64, 7]],
    }


def make_weights(cfg, rng):
    H, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = H // nq
    V = cfg["vocab_size"]

    def rnd(shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    w = {"model.embed_tokens.weight": rnd((V, H), 1.0), "model.norm.weight": (1 + rnd((H,), 0.1)).astype(np.float16)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = rnd((V, H), 2.0 / np.sqrt(H))
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = (1 + rnd((H,), 0.1)).astype(np.float16)
        w[p + "post_attention_layernorm.weight"] = (1 + rnd((H,), 0.1)).astype(np.float16)
        w[p + "self_attn.q_proj.weight"] = rnd((nq * hd, H), 1.0 / np.sqrt(H))
        w[p + "self_attn.k_proj.weight"] = rnd((nkv * hd, H), 1.0 / np.sqrt(H))
        w[p + "self_attn.v_proj.weight"] = rnd((nkv * hd, H), 1.0 / np.sqrt(H))
        if cfg["model_type"] == "qwen2":  # Qwen2's biases are large (k especially): make them matter.
            w[p + "self_attn.q_proj.bias"] = rnd((nq * hd,), 0.5)
            w[p + "self_attn.k_proj.bias"] = rnd((nkv * hd,), 1.0)
            w[p + "self_attn.v_proj.bias"] = rnd((nkv * hd,), 0.5)
        w[p + "self_attn.o_proj.weight"] = rnd((H, nq * hd), 1.0 / np.sqrt(nq * hd))
        if "num_local_experts" in cfg:  # Mixtral's sparse MoE block; a router that prefers clearly
            w[p + "block_sparse_moe.gate.weight"] = rnd((cfg["num_local_experts"], H), 3.0 / np.sqrt(H))
            for e in range(cfg["num_local_experts"]):
                q = p + f"block_sparse_moe.experts.{e}."
                w[q + "w1.weight"] = rnd((F, H), 1.0 / np.sqrt(H))
                w[q + "w2.weight"] = rnd((H, F), 1.0 / np.sqrt(F))
                w[q + "w3.weight"] = rnd((F, H), 1.0 / np.sqrt(H))
            continue
        w[p + "mlp.gate_proj.weight"] = rnd((F, H), 1.0 / np.sqrt(H))
        w[p + "mlp.up_proj.weight"] = rnd((F, H), 1.0 / np.sqrt(H))
        w[p + "mlp.down_proj.weight"] = rnd((H, F), 1.0 / np.sqrt(F))
    return w


# ---- files ----

GGUF_NAMES = {  # llama.cpp's names for the HF ones (gguf-py's tensor map), per layer after blk.N.
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}


def permute_qk(wt, n_head):
    # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: HF's half-split rows -> RoPE pair order.
    return wt.reshape(n_head, 2, wt.shape[0] // n_head // 2, *wt.shape[1:]).swapaxes(1, 2).reshape(wt.shape)


def gguf_mixtral_tensors(cfg, w):
    # Mixtral as llama.cpp writes it: "llama" names, q/k permuted, experts stacked per layer.
    out = {}
    E = cfg["num_local_experts"]
    for name, arr in w.items():
        if name in GGUF_TOP:
            out[GGUF_TOP[name]] = arr
            continue
        parts = name.split(".", 3)
        blk, rest = f"blk.{parts[2]}.", parts[3]
        if rest.startswith("block_sparse_moe.experts."):
            continue
        if rest == "block_sparse_moe.gate.weight":
            out[blk + "ffn_gate_inp.weight"] = arr
            for hf, g in (("w1", "ffn_gate_exps"), ("w3", "ffn_up_exps"), ("w2", "ffn_down_exps")):
                out[blk + g + ".weight"] = np.stack(
                    [w[f"model.layers.{parts[2]}.block_sparse_moe.experts.{e}.{hf}.weight"] for e in range(E)])
            continue
        if rest == "self_attn.q_proj.weight":
            arr = permute_qk(arr, cfg["num_attention_heads"])
        if rest == "self_attn.k_proj.weight":
            arr = permute_qk(arr, cfg["num_key_value_heads"])
        out[blk + GGUF_NAMES[rest]] = arr
    return out


def write_gguf(path, arch, cfg, w):
    import gguf  # gguf-py, llama.cpp's writer

    H, nq = cfg["hidden_size"], cfg["num_attention_heads"]
    moe = "num_local_experts" in cfg
    wr = gguf.GGUFWriter(path, "llama" if moe else arch)
    wr.add_name("lattice tiny " + arch)
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(H)
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_head_count(nq)
    wr.add_head_count_kv(cfg["num_key_value_heads"])
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_bos_token_id(cfg["bos_token_id"])
    wr.add_eos_token_id(cfg["eos_token_id"])
    if moe:
        wr.add_expert_count(cfg["num_local_experts"])
        wr.add_expert_used_count(cfg["num_experts_per_tok"])
        tensors = gguf_mixtral_tensors(cfg, w)
    else:
        # Qwen2 is NEOX-rope in llama.cpp: its converter keeps q/k rows in HF order (no permutation).
        tensors = {}
        for name, arr in w.items():
            if name in GGUF_TOP:
                tensors[GGUF_TOP[name]] = arr
            else:
                parts = name.split(".", 3)  # model, layers, N, rest
                tensors[f"blk.{parts[2]}." + GGUF_NAMES[parts[3]]] = arr
    for g, arr in tensors.items():
        wr.add_tensor(g, arr.astype(np.float32) if arr.ndim == 1 else arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def make_family(spec, out_root):
    cfg = spec["config"]
    w = make_weights(cfg, np.random.default_rng(spec["seed"]))
    d = os.path.join(out_root, spec["name"])
    write_fixture(d, spec, w, N_NEW, "make_family_fixtures.py")
    if spec.get("gguf", True):
        write_gguf(os.path.join(d, "model.gguf"), spec["name"], cfg, w)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "runtime", "model", "families")
    make_family(qwen2_spec(), out)
    make_family(qwen2_swa_spec(), out)
    make_family(mistral_spec(), out)
    make_family(mixtral_spec(), out)


if __name__ == "__main__":
    main()
