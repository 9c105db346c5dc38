"""Generates hf_llama3_random.json: random texts and their ids from Hugging Face `tokenizers`
(the Rust reference implementation) for ../shared/tokenizers/llama3-tokenizer.json.
Development-time only (pip install tokenizers); the test reads the committed JSON.
Usage: python3 make_hf_reference.py SHARED_DIR OUT.json"""
import json
import random
import sys

from tokenizers import Tokenizer

shared, out = sys.argv[1], sys.argv[2]
tok = Tokenizer.from_file(f"{shared}/tokenizers/llama3-tokenizer.json")
pool = open(f"{shared}/tokenizers/ggml-vocab-llama-bpe.gguf.inp", encoding="utf-8").read()
pool = pool.replace("\n__ggml_vocab_test__\n", "\n")
words = ["the", " ", "  ", "\n", "\r\n", "\t", "Hello", "WORLD", "tokenizer", "123", "12345", "4.5", "'s", "'LL",
         "'re", "!!", "é", "中文", "😀", "ß", "Ω", "—", "  \n ", "don't", "x", "A", "١٢٣", "Ⅻ", "½", "\u00a0", "\u3000",
         "ǅ", "<|eot_id|>", "...", "-->", "$$", "(a)", "\u0301", "ﬁ"]
rng = random.Random(7)
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
            if 0xD800 <= cp <= 0xDFFF:
                continue
            parts.append(chr(cp))
    text = "".join(parts)
    ids = tok.encode(text, add_special_tokens=False).ids
    cases.append({"text": text, "ids": ids})
json.dump({"tokenizer": "llama3-tokenizer.json", "generator": "tokenizers " + __import__("tokenizers").__version__,
           "cases": cases}, open(out, "w", encoding="utf-8"), ensure_ascii=False, indent=0)
print(len(cases), "cases")
