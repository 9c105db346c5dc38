"""Generates hf_<vocab>_random.json for the byte-level GGUF vocabs (gpt-2, qwen2, and SmolLM2 when
models/SmolLM2-135M-Instruct.Q4_1.gguf exists): the GGUF's tokens and merges are rebuilt into a
Hugging Face tokenizer.json with that family's published pre-tokenizer (gpt-2: ByteLevel(use_regex);
qwen2: Split(qwen2 regex) + ByteLevel; smollm: Digits(individual) + ByteLevel(use_regex); no
normalizer, as llama.cpp applies none) and random texts are encoded by the Rust `tokenizers`
library. Development-time only (pip install tokenizers). Usage:
  python3 make_hf_reference_gguf.py SHARED_DIR REPO_DIR OUT_DIR"""
import json
import os
import random
import struct
import sys

from tokenizers import Tokenizer


def read_gguf_vocab(path):
    d = open(path, "rb").read()
    assert d[:4] == b"GGUF"
    _, _, nkv = struct.unpack_from("<IQQ", d, 4)
    p = 24
    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def rs(p):
        n, = struct.unpack_from("<Q", d, p)
        return d[p + 8:p + 8 + n].decode("utf-8"), p + 8 + n

    def rv(t, p):
        if t == 8:
            return rs(p)
        if t == 9:
            et, n = struct.unpack_from("<IQ", d, p)
            p += 12
            out = []
            for _ in range(n):
                v, p = rv(et, p)
                out.append(v)
            return out, p
        f = sizes[t]
        return struct.unpack_from("<" + f, d, p)[0], p + struct.calcsize(f)

    kv = {}
    for _ in range(nkv):
        k, p = rs(p)
        t, = struct.unpack_from("<I", d, p)
        p += 4
        v, p = rv(t, p)
        if k.startswith("tokenizer.ggml."):
            kv[k] = v
    return kv


QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
PRE = {
    "gpt-2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
}


def build(kv, pre):
    tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": types[i] == 3} for i, t in enumerate(tokens) if types[i] in (3, 4)]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": PRE[pre], "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": kv["tokenizer.ggml.merges"]}}


shared, repo, out_dir = sys.argv[1:4]
pool = open(f"{shared}/tokenizers/ggml-vocab-gpt-2.gguf.inp", encoding="utf-8").read()
pool = pool.replace("\n__ggml_vocab_test__\n", "\n")
words = ["the", " ", "  ", "\n", "\r\n", "\t", "Hello", "WORLD", "tokenizer", "123", "12345", "4.5", "'s", "'LL", "'re",
         "!!", "é", "中文", "😀", "ß", "Ω", "—", "  \n ", "don't", "x", "A", "١٢٣", "Ⅻ", "½", "\u00a0", "\u3000", "ǅ",
         "...", "-->", "$$", "(a)", "\u0301", "ﬁ", " 42", "  7"]
jobs = [("gpt-2", f"{shared}/tokenizers/ggml-vocab-gpt-2.gguf"), ("qwen2", f"{shared}/tokenizers/ggml-vocab-qwen2.gguf"),
        ("smollm", f"{repo}/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
for name, path in jobs:
    if not os.path.exists(path):
        print("skip", name)
        continue
    kv = read_gguf_vocab(path)
    assert kv["tokenizer.ggml.pre"] == name, kv["tokenizer.ggml.pre"]
    tok = Tokenizer.from_str(json.dumps(build(kv, name)))
    rng = random.Random(11)
    cases = []
    while len(cases) < 600:
        parts = []
        for _ in range(rng.randint(1, 10)):
            r = rng.random()
            if r < 0.45:
                parts.append(rng.choice(words))
            elif r < 0.8:
                at = rng.randrange(len(pool))
                parts.append(pool[at:at + rng.randint(1, 20)])
            else:
                cp = rng.randrange(0x20, 0x2FFFF)
                if not 0xD800 <= cp <= 0xDFFF:
                    parts.append(chr(cp))
        text = "".join(parts)
        cases.append({"text": text, "ids": tok.encode(text, add_special_tokens=False).ids})
    with open(f"{out_dir}/hf_{name}_random.json", "w", encoding="utf-8") as f:
        json.dump({"gguf": os.path.basename(path), "generator": "tokenizers " + __import__("tokenizers").__version__,
                   "cases": cases}, f, ensure_ascii=False, indent=0)
    print(name, len(cases))
