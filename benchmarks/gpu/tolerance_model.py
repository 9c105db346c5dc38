#!/usr/bin/env python3
"""How far the CUDA path's logits may honestly drift from the CPU's: an emulation behind the oracle and
backend tolerances of the CUDA tests (docs/gpu-check.md, "Tolerances"). No GPU: the GPU's numerics are
modelled as the CUDA backend is written (activations stored in fp16 or bf16 after every op, every
reduction and matmul accumulated in fp32, modelled exactly here, then rounded once; int8 GEMMs exact in
int32), the CPU's as fp32 throughout, both against float64, on a Llama-shaped model with the random
weights of runtime/weights/random_source.cpp (uniform, scale 1/sqrt(fan-in); norms 1 + 0.1 u).

  python benchmarks/gpu/tolerance_model.py [--hidden 2048 --ffn 5632 --heads 32 --kv 4 --layers 4
                                            --vocab 32000 --tokens 16 --trials 3]
prints, per activation dtype and quant mode, the worst per-row relative L2 of the logits (GPU model vs
CPU model) over the trials, and the worst |logit error| against the logits' spread (for the tie rule).
Needs numpy (the repository's .venv has it). Seconds at TinyLlama's shape on 2 cores.
"""
import argparse

import numpy as np


def rnd(rng, shape, scale):
    return (rng.uniform(-1, 1, size=shape) * scale).astype(np.float64)


def make_model(rng, a):
    h, f, hd = a.hidden, a.ffn, a.hidden // a.heads
    layers = []
    for _ in range(a.layers):
        layers.append({"n1": 1 + 0.1 * rng.uniform(-1, 1, h), "n2": 1 + 0.1 * rng.uniform(-1, 1, h),
                       "wq": rnd(rng, (a.heads * hd, h), h ** -0.5), "wk": rnd(rng, (a.kv * hd, h), h ** -0.5),
                       "wv": rnd(rng, (a.kv * hd, h), h ** -0.5), "wo": rnd(rng, (h, a.heads * hd), (a.heads * hd) ** -0.5),
                       "wg": rnd(rng, (f, h), h ** -0.5), "wu": rnd(rng, (f, h), h ** -0.5),
                       "wd": rnd(rng, (h, f), f ** -0.5)})
    return {"emb": rnd(rng, (a.vocab, h), 1.0), "layers": layers, "nf": 1 + 0.1 * rng.uniform(-1, 1, h),
            "head": rnd(rng, (a.vocab, h), h ** -0.5)}


def quant_w(w):
    """Symmetric per-output-channel int8 (the project's QuantWeight): returns the dequantized matrix."""
    s = np.abs(w).max(axis=1, keepdims=True) / 127
    return np.clip(np.rint(w / s), -127, 127) * s


def forward(m, ids, a, store, quant):
    """store(x): the rounding of a stored activation; quant: W8A8 (per-token int8 activations)."""
    hd = a.hidden // a.heads
    T = len(ids)

    def linear(x, w):
        if quant:  # per-token dynamic int8 of the stored activation; int32-exact products; one float dequant
            s = np.abs(x).max(axis=1, keepdims=True) / 127
            s[s == 0] = 1
            x = np.clip(np.rint(x / s), -127, 127) * s
        return store(x @ w.T)

    def rms(x, g):
        return store(x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-5) * g)

    x = store(m["emb"][ids])
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for L in m["layers"]:
        wq, wk, wv, wo, wg, wu, wd = ((quant_w(L[k]) if quant else L[k]) for k in ("wq", "wk", "wv", "wo", "wg", "wu", "wd"))
        hN = rms(x, L["n1"])
        q, k, v = linear(hN, wq), linear(hN, wk), linear(hN, wv)
        q = q.reshape(T, a.heads, hd)
        k = np.repeat(k.reshape(T, a.kv, hd), a.heads // a.kv, axis=1)
        v = np.repeat(v.reshape(T, a.kv, hd), a.heads // a.kv, axis=1)
        att = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(axis=2, keepdims=True))
        att /= att.sum(axis=2, keepdims=True)  # softmax in fp32 on both devices: modelled exactly
        o = store(np.einsum("hts,shd->thd", att, v).reshape(T, a.heads * hd))
        x = store(x + linear(o, wo))
        hN = rms(x, L["n2"])
        g, u = linear(hN, wg), linear(hN, wu)
        x = store(x + linear(store(g / (1 + np.exp(-g)) * u), wd))
    return rms(x, m["nf"]) @ m["head"].T  # logits in fp32 on both


def to_f16(x):
    return x.astype(np.float16).astype(np.float64)


def to_bf16(x):
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16  # round to nearest even
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def to_f32(x):
    return x.astype(np.float32).astype(np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, v in (("hidden", 2048), ("ffn", 5632), ("heads", 32), ("kv", 4), ("layers", 4), ("vocab", 32000),
                 ("tokens", 16), ("trials", 3), ("seed", 1)):
        ap.add_argument("--" + k, type=int, default=v)
    a = ap.parse_args()
    print(f"hidden {a.hidden}, ffn {a.ffn}, heads {a.heads}/{a.kv}, {a.layers} layers, vocab {a.vocab}, "
          f"{a.tokens} tokens, {a.trials} trials")
    worst = {}
    for t in range(a.trials):
        rng = np.random.default_rng(a.seed + t)
        m = make_model(rng, a)
        ids = rng.integers(3, a.vocab, a.tokens)
        for quant in (False, True):
            cpu = forward(m, ids, a, to_f32, quant)
            for name, store in (("f16", to_f16), ("bf16", to_bf16)):
                gpu = forward(m, ids, a, store, quant)
                row = np.sqrt(((gpu - cpu) ** 2).sum(1) / (cpu ** 2).sum(1)).max()
                spread = np.abs(gpu - cpu).max() / cpu.std()
                key = (name, "W8A8" if quant else "none")
                worst[key] = max(worst.get(key, (0, 0)), (row, spread))
    for (name, q), (row, spread) in sorted(worst.items()):
        print(f"{name:<5} quant {q:<5} worst per-row relative L2 {row:.2e}, worst |error| / logit std {spread:.2e}")


if __name__ == "__main__":
    main()
