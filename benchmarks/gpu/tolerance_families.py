#!/usr/bin/env python3
"""The block families' logits error under the CUDA backend's numerics: the model behind the tolerances of
test_cuda_golden's "block families on CudaBackend" case and test_cuda_backend's engine case over the same
fixtures (docs/gpu-check.md, Tolerances).

For every fixture of scripts/make_block_family_fixtures.py (Qwen3, Gemma 2, Gemma 3, Phi-3, Phi-3 LongRoPE,
Qwen3-MoE: the same weights, from the same seeds, Qwen3-MoE's router rows tied as there), the fixtures'
float64 forward (scripts/numpy_forward.py) is run twice over each prompt: as written (the reference), and
with the activations rounded to f16 or bf16 after every op (norms, q/k/v projections, QK-norm, rope,
attention, the MLP's projections and product, experts, residual adds, the embedding scale) and the weights
in that dtype, accumulation in float64 (the kernels accumulate in fp32, whose error is far below these
roundings); the logits stay unrounded (the device writes them in f32). Printed: the worst relative L2 over
a family's prompts per dtype, and for Qwen3-MoE the smallest router margin that is not an exact tie (the
duplicated rows stay equal after any rounding, so they tie on both sides). Not modelled: the rounding of
each attention score (the kernels keep scores and softmax in fp32).

Usage: python benchmarks/gpu/tolerance_families.py   (numpy only; seconds)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import make_block_family_fixtures as fx  # noqa: E402
import numpy_forward as nf  # noqa: E402


def to_bf16(x):
    a = np.array(x, dtype=np.float32)
    b = a.view(np.uint32)
    b += 0x7FFF + ((b >> 16) & 1)  # round to nearest even on the 16 dropped bits
    b &= 0xFFFF0000
    return a.astype(np.float64)


ROUND = {"f64": lambda x: np.asarray(x, dtype=np.float64),
         "f16": lambda x: np.asarray(x).astype(np.float16).astype(np.float64),
         "bf16": to_bf16}
R = ROUND["f64"]  # the rounding in force; the shared forward's pieces are wrapped to apply it to their outputs
ORIG = {n: getattr(nf, n) for n in ("rms_norm", "rope", "longrope", "qkv", "attention", "moe")}


def rounded(f):
    def g(*a, **k):
        y = f(*a, **k)
        return tuple(R(t) for t in y) if isinstance(y, tuple) else R(y)
    return g


for _name, _f in ORIG.items():
    setattr(nf, _name, rounded(_f))


def mlp(cfg, W, p, x):
    if p + "mlp.gate_up_proj.weight" in W:
        g, u = np.split(R(x @ W[p + "mlp.gate_up_proj.weight"].T), 2, axis=-1)
    else:
        g, u = R(x @ W[p + "mlp.gate_proj.weight"].T), R(x @ W[p + "mlp.up_proj.weight"].T)
    act = nf.gelu_tanh(g) if nf.is_gemma(cfg) else g / (1 + np.exp(-g))
    return R(R(act * u) @ W[p + "mlp.down_proj.weight"].T)


def forward(cfg, w, ids):
    """nf.forward with R after every op (its structure, line for line)."""
    W = {k: R(v.astype(np.float64)) for k, v in w.items()}
    eps, gemma = cfg["rms_norm_eps"], nf.is_gemma(cfg)
    pos = np.arange(len(ids), dtype=np.float64)
    h = W["model.embed_tokens.weight"][ids]
    if gemma:
        h = R(h * np.sqrt(cfg["hidden_size"]))
    sparse = "num_local_experts" in cfg or "num_experts" in cfg
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = nf.attention(cfg, W, p, nf.rms_norm(h, W[p + "input_layernorm.weight"], eps, gemma), l, pos)
        if gemma:
            h = R(h + nf.rms_norm(a, W[p + "post_attention_layernorm.weight"], eps, True))
            x = nf.rms_norm(h, W[p + "pre_feedforward_layernorm.weight"], eps, True)
        else:
            h = R(h + a)
            x = nf.rms_norm(h, W[p + "post_attention_layernorm.weight"], eps)
        m = nf.moe(cfg, W, p, x) if sparse else mlp(cfg, W, p, x)
        h = R(h + (nf.rms_norm(m, W[p + "post_feedforward_layernorm.weight"], eps, True) if gemma else m))
    x = nf.rms_norm(h, W["model.norm.weight"], eps, gemma)
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    logits = x @ head.T
    cap = cfg.get("final_logit_softcapping")
    return np.tanh(logits / cap) * cap if cap else logits


def weights(spec):
    w = fx.make_weights(spec["config"], np.random.default_rng(spec["seed"]))
    for l, (a, b) in enumerate(spec.get("router_ties", [])):  # as fx.tie_routers, without its files
        g = w[f"model.layers.{l}.mlp.gate.weight"]
        g[b] = g[a]
    return w


def main():
    global R
    for spec in fx.specs():
        cfg, w = spec["config"], weights(spec)
        row = [spec["name"]]
        for dt in ("f16", "bf16"):
            worst = 0.0
            for prompt in spec["prompts"]:
                R = ROUND["f64"]
                ref = forward(cfg, w, prompt)
                R = ROUND[dt]
                got = forward(cfg, w, prompt)
                worst = max(worst, float(np.sqrt(((got - ref) ** 2).sum() / (ref ** 2).sum())))
            row.append(f"{dt} {worst:.2e}")
        if "router_ties" in spec:
            R = ROUND["f64"]
            nf.STATS.clear()
            for prompt in spec["prompts"]:
                forward(cfg, w, prompt)
            row.append(f"router margin (exact ties aside) {nf.STATS['router margin']:.4f}, "
                       f"ties at the boundary {nf.STATS.get('router ties at the top-k boundary', 0)}")
        print("  ".join(row))


if __name__ == "__main__":
    main()
