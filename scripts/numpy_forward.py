"""The float64 NumPy reference forward of every family fixture (tests/runtime/model/families), written from
the semantics of transformers' modeling code (not from lattice's), and the fixture files around it. The two
fixture scripts import it: scripts/make_family_fixtures.py (Qwen2, Mistral, Mixtral: Llama's skeleton, with
GGUF copies) and scripts/make_block_family_fixtures.py (Qwen3, Qwen3-MoE, Gemma 2/3, Phi-3); each keeps
only its specs, its weight generator and (the first) its GGUF writer.

One forward for all of them, per layer (p = "model.layers.N."):
  pre-norm:  h += attn(norm(h));                 h += mlp(norm(h))             (Llama, Qwen, Mistral, Phi-3)
  sandwich:  h += post_attn_norm(attn(norm(h))); h += post_ffn_norm(mlp(pre_ffn_norm(h)))   (Gemma 2/3)
  RMSNorm x / sqrt(mean(x^2) + eps) * w, or * (1 + w) for Gemma (Gemma2RMSNorm / Gemma3RMSNorm).
  attention: q/k/v projections (+ bias where the checkpoint has one: Qwen2; one fused qkv_proj sliced
    q | k | v: Phi-3), QK-norm per head before RoPE where q_norm / k_norm exist (Qwen3, Gemma 3), RoPE by
    rotate_half (pairs i, i + d/2) with inv_freq = base^(-2i/d) (/ factor for linear scaling; Gemma 3's
    local layers use rope_local_base_freq unscaled; Phi-3's longrope: see longrope()), GQA by repeat_kv,
    scores / sqrt(head_dim) (/ sqrt(query_pre_attn_scalar) for Gemma), soft-capped cap * tanh(s / cap)
    where attn_logit_softcapping is set, then the causal mask, plus the sliding window (query i attends
    keys i - W < j <= i) in the layers layer_window() names.
  mlp: down(act(gate(x)) * up(x)), act SiLU (GELU-tanh for Gemma); Phi-3's gate_up_proj.chunk(2), gate first.
  moe (MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock): router logits x @ gate.T, softmax, the top k experts
    (see top_k() for ties), their weights renormalized to sum 1 (Mixtral; Qwen3-MoE when norm_topk_prob),
    h += sum_e w_e * down_e(silu(gate_e x) * up_e x).
  Gemma: embeddings times sqrt(hidden_size); final logits soft-capped where final_logit_softcapping is set.

Expert ties: torch.topk (what transformers' MoE blocks call) does not define the order of tied values
("the indices of tied elements are not guaranteed to be stable", PyTorch's torch.topk note), so the
reference takes lattice's documented rule (runtime/model/moe_routing.h): among equal probabilities, the
lower expert index first (a stable descending sort). forward(..., high_first=True) takes the opposite rule,
so a fixture can show that its ties decide its logits.

Everything in float64 from float16 weights; STATS collects what the options did (soft-caps that bound,
the smallest router margin that is not an exact tie, the exact ties at the top-k boundary).
"""
import json
import os
import struct

import numpy as np

STATS = {}


def rms_norm(x, w, eps, one_plus=False):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * (1.0 + w) if one_plus else y * w


def rope(x, pos, base, factor=1.0):
    # x [T, heads, d]; rotate_half: pairs (i, i + d/2)
    d = x.shape[-1]
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d) / factor
    ang = np.outer(pos, inv)  # [T, d/2]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rot * sin


def longrope(x, pos, cfg):
    # Phi-3's LongRoPE (modeling_rope_utils.py _compute_longrope_parameters, Phi3RotaryEmbedding's dynamic
    # update): inv_freq = 1 / (ext_i * base^(2i/d)), ext the long factors when the forward's length exceeds
    # original_max_position_embeddings, else the short ones; cos and sin times sqrt(1 + ln(max / orig) / ln(orig)).
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


def is_gemma(cfg):
    return cfg["model_type"].startswith("gemma")


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def layer_window(cfg, l):
    # The window of layer l, or None: Gemma 2 every other layer from 0, Gemma 3 all but every
    # sliding_window_pattern-th, Mistral / Mixtral / Phi-3 every layer (when set), Qwen2 / Qwen3 with
    # use_sliding_window the layers l >= max_window_layers ("sliding_attention").
    mt = cfg["model_type"]
    if mt == "gemma2":
        local = (l + 1) % 2 != 0
    elif mt == "gemma3_text":
        local = (l + 1) % cfg["sliding_window_pattern"] != 0
    elif mt in ("mistral", "mixtral", "phi3"):
        local = cfg.get("sliding_window") is not None
    else:
        local = cfg.get("use_sliding_window", False) and l >= cfg.get("max_window_layers", 28)
    return cfg["sliding_window"] if local else None


def qkv(cfg, W, p, x):
    T, nq, nkv, hd = x.shape[0], cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    if p + "self_attn.qkv_proj.weight" in W:  # Phi3Attention: one qkv_proj, sliced q | k | v
        y = x @ W[p + "self_attn.qkv_proj.weight"].T
        return (y[:, : nq * hd].reshape(T, nq, hd), y[:, nq * hd: (nq + nkv) * hd].reshape(T, nkv, hd),
                y[:, (nq + nkv) * hd:].reshape(T, nkv, hd))

    def proj(n, heads):  # plus its bias where the checkpoint has one (Qwen2)
        y = x @ W[p + f"self_attn.{n}_proj.weight"].T
        b = p + f"self_attn.{n}_proj.bias"
        return (y + W[b] if b in W else y).reshape(T, heads, hd)
    return proj("q", nq), proj("k", nkv), proj("v", nkv)


def attention(cfg, W, p, x, l, pos):
    T, nq, nkv, hd = x.shape[0], cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    eps, gemma = cfg["rms_norm_eps"], is_gemma(cfg)
    q, k, v = qkv(cfg, W, p, x)
    if p + "self_attn.q_norm.weight" in W:  # QK-norm: one [head_dim] weight for every head
        q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps, gemma)
        k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps, gemma)
    window = layer_window(cfg, l)
    rs = cfg.get("rope_scaling") or {}
    if rs.get("type") == "longrope":
        q, k = longrope(q, pos, cfg), longrope(k, pos, cfg)
    elif cfg["model_type"] == "gemma3_text" and window:
        q, k = rope(q, pos, cfg["rope_local_base_freq"]), rope(k, pos, cfg["rope_local_base_freq"])
    else:
        factor = rs.get("factor", 1.0) if rs.get("rope_type") == "linear" else 1.0
        q, k = rope(q, pos, cfg["rope_theta"], factor), rope(k, pos, cfg["rope_theta"], factor)
    rep = nq // nkv
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # repeat_kv
    norm = np.sqrt(cfg["query_pre_attn_scalar"] if gemma else hd)
    mask = np.triu(np.full((T, T), -np.inf), 1)  # causal: j <= i
    if window:  # and j > i - window
        mask += np.tril(np.full((T, T), -np.inf), -window)
    out = np.empty((T, nq, hd))
    for h in range(nq):
        s = q[:, h, :] @ k[:, h, :].T / norm
        if cfg.get("attn_logit_softcapping"):
            s = softcap(s, cfg["attn_logit_softcapping"], "attention scores capped")
        s = s + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        out[:, h, :] = s @ v[:, h, :]
    return out.reshape(T, nq * hd) @ W[p + "self_attn.o_proj.weight"].T


def top_k(prob, logits, k, high_first=False):
    # The k most probable experts of one token: a stable descending sort, so among equal probabilities
    # the lower index first (high_first: the higher). Records the margin at the boundary and exact ties.
    E = len(prob)
    order = np.argsort(-prob, kind="stable") if not high_first else E - 1 - np.argsort(-prob[::-1], kind="stable")
    gap = logits[order[k - 1]] - logits[order[k]] if k < E else np.inf
    if gap == 0 and prob[order[k - 1]] == prob[order[k]]:
        STATS["router ties at the top-k boundary"] = STATS.get("router ties at the top-k boundary", 0) + 1
    else:
        STATS["router margin"] = min(STATS.get("router margin", np.inf), gap)
    return order[:k]


def moe_names(cfg, p):
    # (router, expert prefix, gate, up, down): MixtralSparseMoeBlock's or Qwen3MoeSparseMoeBlock's names
    if cfg["model_type"] == "mixtral":
        return p + "block_sparse_moe.gate.weight", p + "block_sparse_moe.experts.", "w1", "w3", "w2"
    return p + "mlp.gate.weight", p + "mlp.experts.", "gate_proj", "up_proj", "down_proj"


def moe(cfg, W, p, x, high_first=False):
    router, ex, gate, up, down = moe_names(cfg, p)
    k = cfg["num_experts_per_tok"]
    renormalize = cfg["model_type"] == "mixtral" or cfg.get("norm_topk_prob", False)  # transformers' defaults
    logits = x @ W[router].T  # [T, E]
    prob = np.exp(logits - logits.max(axis=-1, keepdims=True))
    prob /= prob.sum(axis=-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = top_k(prob[t], logits[t], k, high_first)
        wt = prob[t, top] / prob[t, top].sum() if renormalize else prob[t, top]
        for e, we in zip(top, wt):
            q = ex + f"{e}."
            g = x[t] @ W[q + gate + ".weight"].T
            u = x[t] @ W[q + up + ".weight"].T
            out[t] += we * ((g / (1 + np.exp(-g)) * u) @ W[q + down + ".weight"].T)
    return out


def mlp(cfg, W, p, x):
    if p + "mlp.gate_up_proj.weight" in W:  # Phi3MLP: gate_up_proj(x).chunk(2), gate first
        g, u = np.split(x @ W[p + "mlp.gate_up_proj.weight"].T, 2, axis=-1)
    else:
        g, u = x @ W[p + "mlp.gate_proj.weight"].T, x @ W[p + "mlp.up_proj.weight"].T
    return ((gelu_tanh(g) if is_gemma(cfg) else g / (1 + np.exp(-g))) * u) @ W[p + "mlp.down_proj.weight"].T


def forward(cfg, w, ids, high_first=False):
    """Logits [len(ids), vocab] in float64 of the checkpoint w (name -> float16 array) over ids."""
    W = {k: v.astype(np.float64) for k, v in w.items()}
    eps, gemma = cfg["rms_norm_eps"], is_gemma(cfg)
    pos = np.arange(len(ids), dtype=np.float64)
    h = W["model.embed_tokens.weight"][ids]
    if gemma:
        h = h * np.sqrt(cfg["hidden_size"])
    sparse = "num_local_experts" in cfg or "num_experts" in cfg
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = attention(cfg, W, p, rms_norm(h, W[p + "input_layernorm.weight"], eps, gemma), l, pos)
        if gemma:
            h = h + rms_norm(a, W[p + "post_attention_layernorm.weight"], eps, True)
            x = rms_norm(h, W[p + "pre_feedforward_layernorm.weight"], eps, True)
        else:
            h = h + a
            x = rms_norm(h, W[p + "post_attention_layernorm.weight"], eps)
        m = moe(cfg, W, p, x, high_first) if sparse else mlp(cfg, W, p, x)
        h = h + (rms_norm(m, W[p + "post_feedforward_layernorm.weight"], eps, True) if gemma else m)
    x = rms_norm(h, W["model.norm.weight"], eps, gemma)
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    logits = x @ head.T
    if cfg.get("final_logit_softcapping"):
        logits = softcap(logits, cfg["final_logit_softcapping"], "logits capped")
    return logits


def greedy(cfg, w, prompt, n_new):
    """n_new greedy tokens after prompt (a full forward per token) and the smallest top-2 logit gap."""
    ids, margin = list(prompt), np.inf
    for _ in range(n_new):
        last = forward(cfg, w, ids)[-1]
        top2 = np.sort(last)[-2:]
        margin = min(margin, top2[1] - top2[0])
        ids.append(int(np.argmax(last)))
    return ids[len(prompt):], float(margin)


# ---- files ----

def write_safetensors(path, tensors):
    """name -> array (F16 / F32 by its dtype) or (dtype, array) with dtype "F16", "F32" or "BF16" (a BF16 array
    holds exact bf16 values in f32)."""
    header, offset, blobs = {}, 0, []
    for name, val in tensors.items():
        if isinstance(val, tuple):
            dt, arr = val
            b = (np.asarray(arr, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes() if dt == "BF16" \
                else arr.astype({"F16": np.float16, "F32": np.float32}[dt]).tobytes()
        else:
            arr = val
            dt = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}[arr.dtype]
            b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_fixture(d, spec, w, n_new, script, extra=None):
    """The fixture folder d: config.json, model.safetensors, expected.json (cases[i].prompt_ids, greedy_ids,
    min_greedy_margin, plus `extra`'s keys) and expected.safetensors (case{i}.logits f32 [prompt_len, vocab]),
    the format of ../shared/golden that tests/runtime/model/golden.h reads."""
    cfg = spec["config"]
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    STATS.clear()
    cases, logits = [], {}
    for i, prompt in enumerate(spec["prompts"]):
        logits[f"case{i}.logits"] = forward(cfg, w, prompt).astype(np.float32)
        ids, margin = greedy(cfg, w, prompt, n_new)
        cases.append({"prompt_ids": prompt, "greedy_ids": ids, "min_greedy_margin": round(margin, 4)})
        print(f"{spec['name']} case {i}: greedy {ids} (min margin {margin:.4f})")
    print(f"{spec['name']}: {STATS}")
    write_safetensors(os.path.join(d, "expected.safetensors"), logits)
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"model": spec["name"], "reference": f"float64 NumPy (scripts/{script})", "cases": cases,
                   **(extra or {})}, f, indent=1)
        f.write("\n")
