#!/usr/bin/env python3
"""Writes the fixtures of the families built from lattice's shared blocks beyond Llama's skeleton
(tests/runtime/model/families/{qwen3,gemma2,gemma3,phi3,qwen3-moe}): a tiny random checkpoint each (Hugging
Face safetensors + config.json), the reference logits of every prompt position and 12 greedy tokens from
an independent float64 NumPy forward written from the semantics of transformers' modeling code (not from
lattice's):

  Qwen3ForCausalLM (models/qwen3/modeling_qwen3.py): Qwen2's layer without q/k/v biases, plus
  Qwen3Attention's q_norm / k_norm: an RMSNorm over head_dim (one [head_dim] weight for every head)
  applied to each q and k head after the projection and before RoPE. Window: with use_sliding_window,
  the layers i >= max_window_layers ("sliding_attention"): query i attends keys i - W < j <= i.
  Qwen3MoeForCausalLM (models/qwen3_moe/modeling_qwen3_moe.py, Qwen3MoeSparseMoeBlock): router logits
  x @ gate.T, softmax in float, top num_experts_per_tok (lower index first on ties), renormalized to
  sum 1 when norm_topk_prob, experts SwiGLU of moe_intermediate_size; every layer sparse.
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

Weights are float16 values stored F16 (norms too), so the checkpoint holds exactly the values the
float64 reference used. Options are chosen to bite: windows shorter than the prompts, soft-caps below
the scores' and logits' magnitudes (the script prints how often they bind), head_dim != hidden /
heads. Deterministic (fixed seeds); needs numpy only. Reuses make_family_fixtures.py's file writers.
Usage: python3 scripts/make_block_family_fixtures.py [OUT_DIR]  (default tests/runtime/model/families)
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_family_fixtures import write_safetensors  # noqa: E402

N_NEW = 12
STATS = {}


def base_config(model_type, cls, **kw):
    c = {"architectures": [cls], "model_type": model_type, "hidden_size": 32, "intermediate_size": 48,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
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
         "config": base_config("qwen3", "Qwen3ForCausalLM", hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
                               use_sliding_window=True, sliding_window=5, max_window_layers=1,
                               rope_theta=1000000.0)},
        {"name": "gemma2", "seed": 32, "prompts": [long_prompt, [2, 9, 33, 70, 12, 9, 4, 51]],
         "config": base_config("gemma2", "Gemma2ForCausalLM", hidden_act="gelu_pytorch_tanh",
                               hidden_activation="gelu_pytorch_tanh", num_hidden_layers=3, sliding_window=4,
                               query_pre_attn_scalar=24, attn_logit_softcapping=3.0,
                               final_logit_softcapping=1.5)},
        {"name": "gemma3", "seed": 33, "prompts": [long_prompt, [2, 9, 33, 70, 12, 9, 4, 51]],
         "config": base_config("gemma3_text", "Gemma3ForCausalLM", hidden_act="gelu_pytorch_tanh",
                               hidden_activation="gelu_pytorch_tanh", num_hidden_layers=6, sliding_window=4,
                               sliding_window_pattern=6, query_pre_attn_scalar=16,
                               attn_logit_softcapping=None, final_logit_softcapping=None,
                               rope_theta=1000000.0, rope_local_base_freq=10000.0,
                               rope_scaling={"rope_type": "linear", "factor": 4.0})},
        {"name": "phi3", "seed": 35, "prompts": [long_prompt, [1, 9, 33, 70, 12, 9, 4, 51]],
         "config": base_config("phi3", "Phi3ForCausalLM", hidden_act="silu", sliding_window=5,
                               original_max_position_embeddings=128, tie_word_embeddings=False,
                               rope_theta=10000.0)},
        {"name": "phi3-longrope", "seed": 36, "prompts": [long_prompt, [1, 9, 33, 70, 12, 9, 4, 51, 77, 3]],
         "config": base_config("phi3", "Phi3ForCausalLM", hidden_act="silu", sliding_window=None,
                               original_max_position_embeddings=8, tie_word_embeddings=False,
                               rope_theta=10000.0,
                               rope_scaling={"type": "longrope",
                                             "short_factor": [round(float(x), 3) for x in rng.uniform(1, 2, 8)],
                                             "long_factor": [round(float(x), 3) for x in rng.uniform(1, 6, 8)]})},
        {"name": "qwen3-moe", "seed": 34, "prompts": [long_prompt, [1, 5, 88, 31, 90, 64, 7]],
         "config": base_config("qwen3_moe", "Qwen3MoeForCausalLM", hidden_act="silu", num_experts=8,
                               num_experts_per_tok=3, moe_intermediate_size=16, norm_topk_prob=True,
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
            w[p + "mlp.gate_up_proj.weight"] = np.concatenate([w.pop(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")])
    return w


# ---- the float64 reference forward ----

def rms_norm(x, w, eps, one_plus):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * (1.0 + w) if one_plus else y * w


def rope(x, pos, base, factor=1.0):
    d = x.shape[-1]
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d) / factor
    ang = np.outer(pos, inv)
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rot * sin


def longrope(x, pos, cfg):
    # Phi-3's LongRoPE: the ext factors by the forward's length, cos / sin times the attention factor
    rs, d = cfg["rope_scaling"], x.shape[-1]
    orig, max_pos = cfg["original_max_position_embeddings"], cfg["max_position_embeddings"]
    ext = np.array(rs["long_factor"] if len(pos) > orig else rs["short_factor"], dtype=np.float64)
    inv = 1.0 / (ext * cfg["rope_theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d))
    factor = max_pos / orig
    af = np.sqrt(1 + np.log(factor) / np.log(orig)) if factor > 1 else 1.0
    ang = np.outer(pos, inv)
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :] * af
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :] * af
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rot * sin


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def softcap(x, cap, what):
    STATS[what] = STATS.get(what, 0) + int(np.sum(np.abs(x) > cap))
    return np.tanh(x / cap) * cap


def windowed(cfg, l):
    mt = cfg["model_type"]
    if mt == "gemma2":
        return (l + 1) % 2 != 0
    if mt == "gemma3_text":
        return (l + 1) % cfg["sliding_window_pattern"] != 0
    if mt == "phi3":
        return cfg.get("sliding_window") is not None
    return cfg.get("use_sliding_window", False) and l >= cfg.get("max_window_layers", 28)


def attention(cfg, W, p, x, l, pos):
    T = x.shape[0]
    nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    mt, eps = cfg["model_type"], cfg["rms_norm_eps"]
    gemma = mt.startswith("gemma")
    if mt == "phi3":  # Phi3Attention: one qkv_proj, sliced q | k | v
        qkv = x @ W[p + "self_attn.qkv_proj.weight"].T
        q = qkv[:, : nq * hd].reshape(T, nq, hd)
        k = qkv[:, nq * hd: (nq + nkv) * hd].reshape(T, nkv, hd)
        v = qkv[:, (nq + nkv) * hd:].reshape(T, nkv, hd)
    else:
        q = (x @ W[p + "self_attn.q_proj.weight"].T).reshape(T, nq, hd)
        k = (x @ W[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        v = (x @ W[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
    if p + "self_attn.q_norm.weight" in W:
        q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps, gemma)
        k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps, gemma)
    local = windowed(cfg, l)
    if mt == "gemma3_text" and local:
        base, factor = cfg["rope_local_base_freq"], 1.0
    else:
        rs = cfg.get("rope_scaling") or {}
        base, factor = cfg["rope_theta"], rs.get("factor", 1.0) if rs.get("rope_type") == "linear" else 1.0
    if (cfg.get("rope_scaling") or {}).get("type") == "longrope":
        q, k = longrope(q, pos, cfg), longrope(k, pos, cfg)
    else:
        q, k = rope(q, pos, base, factor), rope(k, pos, base, factor)
    rep = nq // nkv
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scaling = cfg["query_pre_attn_scalar"] ** -0.5 if gemma else hd ** -0.5
    mask = np.triu(np.full((T, T), -np.inf), 1)
    if local:
        mask += np.tril(np.full((T, T), -np.inf), -cfg["sliding_window"])
    out = np.empty((T, nq, hd))
    for h in range(nq):
        s = q[:, h, :] @ k[:, h, :].T * scaling
        if cfg.get("attn_logit_softcapping"):
            s = softcap(s, cfg["attn_logit_softcapping"], "attention scores capped")
        s = s + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        out[:, h, :] = s @ v[:, h, :]
    return out.reshape(T, nq * hd) @ W[p + "self_attn.o_proj.weight"].T


def moe(cfg, W, p, x):
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    logits = x @ W[p + "mlp.gate.weight"].T
    prob = np.exp(logits - logits.max(axis=-1, keepdims=True))
    prob /= prob.sum(axis=-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        order = np.argsort(-prob[t], kind="stable")
        STATS["router margin"] = min(STATS.get("router margin", np.inf), logits[t, order[k - 1]] - logits[t, order[k]])
        top = order[:k]
        wt = prob[t, top] / prob[t, top].sum() if cfg["norm_topk_prob"] else prob[t, top]
        for e, we in zip(top, wt):
            q = p + f"mlp.experts.{e}."
            g, u = x[t] @ W[q + "gate_proj.weight"].T, x[t] @ W[q + "up_proj.weight"].T
            out[t] += we * ((g / (1 + np.exp(-g)) * u) @ W[q + "down_proj.weight"].T)
    return out


def forward(cfg, w, ids):
    W = {k: v.astype(np.float64) for k, v in w.items()}
    eps, gemma = cfg["rms_norm_eps"], cfg["model_type"].startswith("gemma")
    pos = np.arange(len(ids), dtype=np.float64)
    h = W["model.embed_tokens.weight"][ids]
    if gemma:
        h = h * np.sqrt(cfg["hidden_size"])
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = attention(cfg, W, p, rms_norm(h, W[p + "input_layernorm.weight"], eps, gemma), l, pos)
        if gemma:
            h = h + rms_norm(a, W[p + "post_attention_layernorm.weight"], eps, True)
            x = rms_norm(h, W[p + "pre_feedforward_layernorm.weight"], eps, True)
        else:
            h = h + a
            x = rms_norm(h, W[p + "post_attention_layernorm.weight"], eps, False)
        if "num_experts" in cfg:
            h = h + moe(cfg, W, p, x)
            continue
        if cfg["model_type"] == "phi3":  # Phi3MLP: gate_up_proj(x).chunk(2), gate first
            g, u = np.split(x @ W[p + "mlp.gate_up_proj.weight"].T, 2, axis=-1)
        else:
            g, u = x @ W[p + "mlp.gate_proj.weight"].T, x @ W[p + "mlp.up_proj.weight"].T
        m = ((gelu_tanh(g) if gemma else g / (1 + np.exp(-g))) * u) @ W[p + "mlp.down_proj.weight"].T
        h = h + (rms_norm(m, W[p + "post_feedforward_layernorm.weight"], eps, True) if gemma else m)
    x = rms_norm(h, W["model.norm.weight"], eps, gemma)
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    logits = x @ head.T
    if cfg.get("final_logit_softcapping"):
        logits = softcap(logits, cfg["final_logit_softcapping"], "logits capped")
    return logits


def greedy(cfg, w, prompt):
    ids, margin = list(prompt), np.inf
    for _ in range(N_NEW):
        last = forward(cfg, w, ids)[-1]
        top2 = np.sort(last)[-2:]
        margin = min(margin, top2[1] - top2[0])
        ids.append(int(np.argmax(last)))
    return ids[len(prompt):], float(margin)


def make_family(spec, out_root):
    cfg = spec["config"]
    w = make_weights(cfg, np.random.default_rng(spec["seed"]))
    d = os.path.join(out_root, spec["name"])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    STATS.clear()
    cases, logits = [], {}
    for i, prompt in enumerate(spec["prompts"]):
        logits[f"case{i}.logits"] = forward(cfg, w, prompt).astype(np.float32)
        ids, margin = greedy(cfg, w, prompt)
        cases.append({"prompt_ids": prompt, "greedy_ids": ids, "min_greedy_margin": round(margin, 4)})
        print(f"{spec['name']} case {i}: greedy {ids} (min margin {margin:.4f})")
    print(f"{spec['name']}: {STATS}")
    write_safetensors(os.path.join(d, "expected.safetensors"), logits)
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"model": spec["name"], "reference": "float64 NumPy (scripts/make_block_family_fixtures.py)",
                   "cases": cases}, f, indent=1)
        f.write("\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "runtime", "model", "families")
    for spec in specs():
        make_family(spec, out)


if __name__ == "__main__":
    main()
