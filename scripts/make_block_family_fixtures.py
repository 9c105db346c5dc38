#!/usr/bin/env python3
"""Writes the fixtures of the families built from lattice's shared blocks beyond Llama's skeleton
(tests/runtime/model/families/{qwen3,gemma2,gemma3,phi3,qwen3-moe}): a tiny random checkpoint each (Hugging
Face safetensors + config.json), the reference logits of every prompt position and 12 greedy tokens from
the independent float64 NumPy forward of scripts/numpy_forward.py, written from the semantics of
transformers' modeling code (not from lattice's); what it computes for these families:

  Qwen3ForCausalLM (models/qwen3/modeling_qwen3.py): Qwen2's layer without q/k/v biases, plus
  Qwen3Attention's q_norm / k_norm: an RMSNorm over head_dim (one [head_dim] weight for every head)
  applied to each q and k head after the projection and before RoPE. Window: with use_sliding_window,
  the layers i >= max_window_layers ("sliding_attention"): query i attends keys i - W < j <= i.
  Qwen3MoeForCausalLM (models/qwen3_moe/modeling_qwen3_moe.py, Qwen3MoeSparseMoeBlock): router logits
  x @ gate.T, softmax in float, top num_experts_per_tok, renormalized to sum 1 when norm_topk_prob,
  experts SwiGLU of moe_intermediate_size; every layer sparse. Exact ties: in each layer one expert's
  router row is a copy of another's (router_ties), so their logits are equal for every token and, where
  the pair straddles the top-k boundary (some tokens of every prompt; the script asserts it), the tie
  rule alone picks the expert. torch.topk leaves the order of ties undefined (PyTorch's note on it), so
  the rule is lattice's (runtime/model/moe_routing.h) and the reference's alike: the lower expert index
  first. ties.safetensors holds the logits under the opposite rule, so a test can show they differ.
  Gemma2ForCausalLM (models/gemma2/modeling_gemma2.py): embeddings times sqrt(hidden_size);
  Gemma2RMSNorm x / sqrt(mean(x^2) + eps) * (1 + w); a layer is
    h = h + post_attention_layernorm(attn(input_layernorm(h)))
    h = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
  with mlp = down(gelu_tanh(gate(x)) * up(x)) and attention scores (q k^T) * query_pre_attn_scalar^-0.5,
  soft-capped s -> cap * tanh(s / cap) (attn_logit_softcapping) before the causal mask; layer i
  windowed (sliding_window) when (i + 1) % 2 != 0; final logits soft-capped (final_logit_softcapping).
  Gemma3ForCausalLM (models/gemma3/modeling_gemma3.py, model_type gemma3_text): Gemma 2's layer
  without soft-caps (null in the config), with q_norm / k_norm (Gemma3RMSNorm, (1 + w)) per head before
  RoPE; layer i windowed when (i + 1) % sliding_window_pattern != 0, its RoPE from rope_local_base_freq
  (unscaled), the global layers' from rope_theta with rope_scaling (linear: inv_freq / factor).
  Phi3ForCausalLM (models/phi3/modeling_phi3.py): Llama's layer (RMSNorm, SwiGLU) over fused
  projections: qkv = qkv_proj(x), q = qkv[:, :nq*hd], k = the next nkv*hd, v = the rest;
  gate, up = gate_up_proj(x).chunk(2) (gate first), mlp = down(silu(gate) * up); the sliding window
  in every layer. With rope_scaling longrope (modeling_rope_utils.py _compute_longrope_parameters and
  Phi3RotaryEmbedding's dynamic update): inv_freq = 1 / (ext_i * base^(2i/d)), ext the long_factor when
  the forward's length exceeds original_max_position_embeddings (every forward here: the prompts are
  longer), else the short_factor; cos and sin times sqrt(1 + ln(max_pos / orig) / ln(orig)).
RoPE everywhere: rotate_half (pairs i, i + d/2), inv_freq = base^(-2i/d); GQA by repeat_kv.

Shapes that tp 2 and tp 3 both divide: 12 query heads over 6 kv heads (GQA split at both), Gemma 3's
6 over 1 (as Gemma 3 1B: the kv head replicated), Phi-3's 6 over 6 (MHA, as Phi-3-mini: each rank's q, k
and v rows of the fused qkv_proj), intermediate 48, moe_intermediate 24, vocab 96, head_dim 16.
Weights are float16 values stored F16 (norms too), so the checkpoint holds exactly the values the
float64 reference used. Options are chosen to bite: windows shorter than the prompts, soft-caps below
the scores' and logits' magnitudes (the script prints how often they bind), head_dim != hidden /
heads. Deterministic (fixed seeds); needs numpy only.
Usage: python3 scripts/make_block_family_fixtures.py [OUT_DIR]  (default tests/runtime/model/families)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_forward import STATS, forward, write_fixture, write_safetensors  # noqa: E402

N_NEW = 12


def base_config(model_type, cls, **kw):
    c = {"architectures": [cls], "model_type": model_type, "hidden_size": 32, "intermediate_size": 48,
         "num_hidden_layers": 2, "num_attention_heads": 12, "num_key_value_heads": 6, "head_dim": 16,
         "vocab_size": 96, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
         "max_position_embeddings": 128, "tie_word_embeddings": True, "torch_dtype": "float16",
         "bos_token_id": 1, "eos_token_id": 2}
    c.update(kw)
    return c


def specs():
    rng = np.random.default_rng(5)
    long_prompt = [1] + [int(x) for x in rng.integers(3, 96, 13)]
    return [
        {"name": "qwen3", "seed": 31, "prompts": [long_prompt, [1, 40, 41, 42, 43, 44, 45]],
         "config": base_config("qwen3", "Qwen3ForCausalLM", hidden_act="silu", attention_bias=False,
                               tie_word_embeddings=False,
                               use_sliding_window=True, sliding_window=5, max_window_layers=1,
                               rope_theta=1000000.0)},
        {"name": "gemma2", "seed": 47,  # of 32..51: varied greedy tokens, top-2 gaps >= 0.01 under the cap
         "prompts": [long_prompt, [2, 9, 33, 70, 12, 9, 4, 51]],
         "config": base_config("gemma2", "Gemma2ForCausalLM", hidden_act="gelu_pytorch_tanh",
                               hidden_activation="gelu_pytorch_tanh", num_hidden_layers=3, sliding_window=4,
                               query_pre_attn_scalar=24, attn_logit_softcapping=3.0,
                               final_logit_softcapping=1.5)},
        {"name": "gemma3", "seed": 33, "prompts": [long_prompt, [2, 9, 33, 70, 12, 9, 4, 51]],
         "config": base_config("gemma3_text", "Gemma3ForCausalLM", hidden_act="gelu_pytorch_tanh",
                               hidden_activation="gelu_pytorch_tanh", num_hidden_layers=6, sliding_window=4,
                               num_attention_heads=6, num_key_value_heads=1,
                               sliding_window_pattern=6, query_pre_attn_scalar=16,
                               attn_logit_softcapping=None, final_logit_softcapping=None,
                               rope_theta=1000000.0, rope_local_base_freq=10000.0,
                               rope_scaling={"rope_type": "linear", "factor": 4.0})},
        {"name": "phi3", "seed": 35, "prompts": [long_prompt, [1, 9, 33, 70, 12, 9, 4, 51]],
         "config": base_config("phi3", "Phi3ForCausalLM", hidden_act="silu", sliding_window=5,
                               num_attention_heads=6, num_key_value_heads=6,
                               original_max_position_embeddings=128, tie_word_embeddings=False,
                               rope_theta=10000.0)},
        {"name": "phi3-longrope", "seed": 36, "prompts": [long_prompt, [1, 9, 33, 70, 12, 9, 4, 51, 77, 3]],
         "config": base_config("phi3", "Phi3ForCausalLM", hidden_act="silu", sliding_window=None,
                               num_attention_heads=6, num_key_value_heads=6,
                               original_max_position_embeddings=8, tie_word_embeddings=False,
                               rope_theta=10000.0,
                               rope_scaling={"type": "longrope",
                                             "short_factor": [round(float(x), 3) for x in rng.uniform(1, 2, 8)],
                                             "long_factor": [round(float(x), 3) for x in rng.uniform(1, 6, 8)]})},
        {"name": "qwen3-moe", "seed": 58,  # of 34..73: a wide router margin besides the exact ties
         "prompts": [long_prompt, [1, 5, 88, 31, 90, 64, 7]],
         "router_ties": [(1, 6), (2, 3)],  # per layer: expert b's router row is expert a's (exact ties)
         "config": base_config("qwen3_moe", "Qwen3MoeForCausalLM", hidden_act="silu", num_experts=8,
                               num_experts_per_tok=3, moe_intermediate_size=24, norm_topk_prob=True,
                               decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)},
    ]


def make_weights(cfg, rng):
    H, F, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    gemma = cfg["model_type"].startswith("gemma")

    def rnd(shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    def norm(n):  # Gemma stores w (applied as 1 + w, so near 0); the others near 1
        return rnd((n,), 0.2) if gemma else (1 + rnd((n,), 0.2)).astype(np.float16)

    w = {"model.embed_tokens.weight": rnd((V, H), 1.0 / np.sqrt(H) if gemma else 1.0), "model.norm.weight": norm(H)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = rnd((V, H), 2.0 / np.sqrt(H))
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm(H)
            w[p + "post_feedforward_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = rnd((nq * hd, H), 1.5 / np.sqrt(H))
        w[p + "self_attn.k_proj.weight"] = rnd((nkv * hd, H), 1.5 / np.sqrt(H))
        w[p + "self_attn.v_proj.weight"] = rnd((nkv * hd, H), 1.0 / np.sqrt(H))
        w[p + "self_attn.o_proj.weight"] = rnd((H, nq * hd), 1.0 / np.sqrt(nq * hd))
        if cfg["model_type"] in ("qwen3", "qwen3_moe", "gemma3_text"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        if "num_experts" in cfg:
            E, Fe = cfg["num_experts"], cfg["moe_intermediate_size"]
            w[p + "mlp.gate.weight"] = rnd((E, H), 2.0 / np.sqrt(H))
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                w[q + "gate_proj.weight"] = rnd((Fe, H), 1.0 / np.sqrt(H))
                w[q + "up_proj.weight"] = rnd((Fe, H), 1.0 / np.sqrt(H))
                w[q + "down_proj.weight"] = rnd((H, Fe), 1.0 / np.sqrt(Fe))
            continue
        w[p + "mlp.gate_proj.weight"] = rnd((F, H), 1.0 / np.sqrt(H))
        w[p + "mlp.up_proj.weight"] = rnd((F, H), 1.0 / np.sqrt(H))
        w[p + "mlp.down_proj.weight"] = rnd((H, F), 1.0 / np.sqrt(F))
        if cfg["model_type"] == "phi3":  # Phi-3's checkpoint holds them fused: q|k|v and gate|up rows
            w[p + "self_attn.qkv_proj.weight"] = np.concatenate(
                [w.pop(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")])
            w[p + "mlp.gate_up_proj.weight"] = np.concatenate(
                [w.pop(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")])
    return w


def tie_routers(spec, w, d):
    # Exact expert ties: in layer l, expert b's router row becomes expert a's, so their logits are equal
    # for every token (in float64 here and in lattice's f32 GEMM alike) and their probabilities too. Where
    # the pair straddles the top-k boundary only the tie rule picks the expert (numpy_forward.top_k: the
    # lower index). ties.safetensors holds the logits under the opposite rule (case{i}.logits): far from
    # expected.safetensors', so a run that broke the ties the other way could not pass.
    for l, (a, b) in enumerate(spec["router_ties"]):
        g = w[f"model.layers.{l}.mlp.gate.weight"]
        g[b] = g[a]
    ties, other, diff = [], {}, []
    for i, prompt in enumerate(spec["prompts"]):
        STATS.clear()
        low = forward(spec["config"], w, prompt)
        ties.append(STATS.get("router ties at the top-k boundary", 0))
        high = forward(spec["config"], w, prompt, high_first=True)
        diff.append(float(np.linalg.norm(high - low) / np.linalg.norm(low)))
        other[f"case{i}.logits"] = high.astype(np.float32)
        assert ties[-1] > 0 and diff[-1] > 1e-3, f"{spec['name']} case {i}: {ties[-1]} ties, rel diff {diff[-1]}"
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "ties.safetensors"), other)
    print(f"{spec['name']}: router ties at the top-k boundary per prompt {ties}, the other rule off by {diff}")
    pairs = [[l, a, b] for l, (a, b) in enumerate(spec["router_ties"])]
    return {"tie_rule": "lower expert index first", "router_ties": pairs, "boundary_ties": ties,
            "other_rule_rel_diff": [round(x, 4) for x in diff]}


def make_family(spec, out_root):
    w = make_weights(spec["config"], np.random.default_rng(spec["seed"]))
    d = os.path.join(out_root, spec["name"])
    extra = tie_routers(spec, w, d) if "router_ties" in spec else None
    write_fixture(d, spec, w, N_NEW, "make_block_family_fixtures.py", extra)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "runtime", "model", "families")
    for spec in specs():
        make_family(spec, out)


if __name__ == "__main__":
    main()
