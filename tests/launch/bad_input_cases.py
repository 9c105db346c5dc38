"""The case table of test_bad_input.py, one Case per hostile input, grouped by class: odd files, corrupt
safetensors / config / GGUF / tokenizer, memory bombs, garbage weights, flags out of range, write errors,
clobbering, signals. `setup(tmp)` builds the input and returns extra arguments; `check(tmp, result)`
returns a problem string (or None) about files after the run.

Some cases belong to the hardening of serve, batch and convert against hostile or unlucky input, which
docs/testing.md maps to its tests ("Hardening: serve, batch and convert against hostile or unlucky
input"); the ones here:
  - resume after the input was edited: "batch --output's fingerprint (OUTPUT.input) names its --input"
  - huge and deeply nested batch lines: "batch: a 60 MB line (12M token ids) is an error record, at little
    memory", "batch: a 20 MB line of nested [ is an error record, at little memory"
  - a small KV cache: "batch: --kv-cache-gb 0.02 (29 blocks), a chat line without max_tokens runs"
  - batch's output refusals: "batch --output is a FIFO: refused as an appended file"
The others live beside the server or batch they need: test_batch.py, test_convert.sh, test_serve_http.cpp,
test_serve.py, test_openai_sampling.cpp and tests/runtime/engine/test_client.cpp.
"""
import json
import os
import resource
import signal
import stat
import struct

import bad_inputs as B

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MODEL = os.environ.get("LATTICE_DEFAULT_MODEL") or os.path.join(SRC, "models",
                                                                         "SmolLM2-135M-Instruct.Q4_1.gguf")


class Case:
    def __init__(self, name, args, rc=1, needle=None, setup=None, check=None, stdout="file", logs_ok=False,
                 max_rss_mb=None, needs_alloc_failure=False, limits=True, extra_limits=(), on_start=None,
                 needs_cores=1, error_line=None, stderr="file"):
        self.name, self.args, self.rc, self.needle, self.setup, self.check = name, args, rc, needle, setup, check
        self.stdout, self.logs_ok, self.max_rss_mb, self.limits = stdout, logs_ok, max_rss_mb, limits
        self.needs_alloc_failure, self.extra_limits, self.on_start = needs_alloc_failure, extra_limits, on_start
        self.needs_cores, self.stderr = needs_cores, stderr
        self.error_line = rc > 0 if error_line is None else error_line  # killed by a signal: no line to print

    def skip_reason(self, asan):
        if asan and self.needs_alloc_failure:
            return "needs an allocation to fail under RLIMIT_AS (ASan aborts on allocation failure instead)"
        if len(os.sched_getaffinity(0)) < self.needs_cores:
            return f"needs {self.needs_cores} usable cores"
        return None


def gen(model, *more):
    return ["generate", "--model", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "2"] + list(more)


def kind_is(path, test, what):
    """check(): `path` (relative to tmp) still is what it was."""
    def check(tmp, r):
        st = os.lstat(os.path.join(tmp, path) if not path.startswith("/") else path)
        return None if test(st.st_mode) else f"{path} is no longer {what}"
    return check


def content_is(path, data):
    def check(tmp, r):
        with open(os.path.join(tmp, path), "rb") as f:
            return None if f.read() == data else f"{path} was changed"
    return check


def absent(path):
    def check(tmp, r):
        return f"{path} exists after the run" if os.path.lexists(os.path.join(tmp, path)) else None
    return check


def all_of(*checks):
    def check(tmp, r):
        for c in checks:
            msg = c(tmp, r)
            if msg:
                return msg
        return None
    return check


def cases(shared):
    g = os.path.join(shared, "golden")
    llama2, tied, gqa = os.path.join(g, "tiny-llama2"), os.path.join(g, "tiny-fp16-tied"), os.path.join(g, "tiny-gqa-llama3")
    gguf_f32 = os.path.join(g, "gguf", "tiny-llama2.f32.gguf")
    C = []

    def model_copy(name="tiny-llama2", edit=None, **cfg):
        """setup(): a copy of a golden model in tmp/m (config fields changed, then edit(dir))."""
        def setup(tmp):
            d = B.copy_model(shared, name, os.path.join(tmp, "m"))
            if cfg:
                B.edit_config(d, **cfg)
            if edit:
                edit(d)
            return []
        return setup

    def fifo(name):
        def make(d):
            p = os.path.join(d, name)
            if os.path.lexists(p):
                os.remove(p)
            os.mkfifo(p)
        return make

    # ---- odd files where files are read (a FIFO must not block; a loop must not be an internal error)
    C += [
        Case("model path missing", gen("{tmp}/nope"), needle="does not exist"),
        Case("model is a FIFO (.gguf)", gen("{tmp}/f.gguf"), needle="FIFO",
             setup=lambda t: os.mkfifo(os.path.join(t, "f.gguf")) or []),
        Case("model is a character device", gen("/dev/null"), needle="character device"),
        Case("model is a symlink loop", gen("{tmp}/loop"), needle="symbolic links",
             setup=lambda t: os.symlink("loop", os.path.join(t, "loop")) or []),
        Case("config.json is a FIFO", gen("{tmp}/m"), needle=["config.json", "FIFO"], setup=model_copy(edit=fifo("config.json"))),
        Case("config.json is a directory", gen("{tmp}/m"), needle=["config.json", "directory"],
             setup=model_copy(edit=lambda d: (os.remove(os.path.join(d, "config.json")), os.mkdir(os.path.join(d, "config.json"))))),
        Case("config.json is a symlink loop", gen("{tmp}/m"), needle=["config.json", "symbolic links"],
             setup=model_copy(edit=lambda d: (os.remove(os.path.join(d, "config.json")),
                                              os.symlink("config.json", os.path.join(d, "config.json"))))),
        Case("config.json missing", gen("{tmp}/m"), needle="config.json",
             setup=model_copy(edit=lambda d: os.remove(os.path.join(d, "config.json")))),
        Case("model.safetensors is a FIFO", gen("{tmp}/m"), needle=["model.safetensors", "FIFO"],
             setup=model_copy(edit=fifo("model.safetensors"))),
        Case("shard is a FIFO", gen("{tmp}/m"), needle=["model-00002-of-00002.safetensors", "FIFO"],
             setup=model_copy("tiny-gqa-llama3", edit=fifo("model-00002-of-00002.safetensors"))),
        Case("index.json is a FIFO", gen("{tmp}/m"), needle=["index.json", "FIFO"],
             setup=model_copy("tiny-gqa-llama3", edit=fifo("model.safetensors.index.json"))),
        Case("empty .gguf", gen("{tmp}/e.gguf"), needle="empty file",
             setup=lambda t: open(os.path.join(t, "e.gguf"), "wb").close() or []),
        Case("tokenizer is a FIFO", ["tokenize", "--tokenizer", "{tmp}/t.model", "--text", "hi"], needle="FIFO",
             setup=lambda t: os.mkfifo(os.path.join(t, "t.model")) or []),
        Case("tokenizer is not SentencePiece", ["tokenize", "--tokenizer", "/etc/hostname", "--text", "hi"],
             needle="not a SentencePiece model"),
        Case("calibrate text is a FIFO", ["calibrate", "--model", DEFAULT_MODEL, "--text", "{tmp}/t", "--out", "{tmp}/s.st"],
             needle=["--text", "FIFO"], setup=lambda t: os.mkfifo(os.path.join(t, "t")) or []),
    ]

    # ---- corrupt safetensors (and memory bombs in the header)
    def st_edit(fn):
        return model_copy(edit=lambda d: fn(os.path.join(d, "model.safetensors")))

    def nested(p):
        B.st_write_raw(p, b"[" * (15 << 20))

    def many_tensors(p):
        body = ",".join(f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(200000))
        B.st_write_raw(p, ("{" + body + "}").encode())

    def unpadded(p):
        h, data = B.st_read(p)
        text = json.dumps(h, separators=(",", ":"))
        if len(text) % 2 == 0:
            text += " "  # odd length: every bf16 tensor starts at an odd file offset
        B.st_write_raw(p, text.encode(), data)

    def shape_string(p):
        h, data = B.st_read(p)
        h["model.norm.weight"]["shape"] = "64"
        B.st_write(p, h, data)

    C += [
        Case("safetensors truncated", gen("{tmp}/m"), needle="model.safetensors",
             setup=st_edit(lambda p: os.truncate(p, 20000))),
        Case("safetensors header length beyond the limit", gen("{tmp}/m"), needle="byte limit",
             setup=st_edit(lambda p: B.st_write_raw(p, b"{}", length=89 << 20))),
        Case("safetensors 15 MB of nested arrays (fast, cheap)", gen("{tmp}/m"), needle="nested deeper than 8",
             setup=st_edit(nested), max_rss_mb=160),
        Case("safetensors 200k tensors (fast, cheap)", gen("{tmp}/m"), needle="65536 tensors",
             setup=st_edit(many_tensors), max_rss_mb=160),
        Case("safetensors shape given as a string", gen("{tmp}/m"), needle="not a list of integers",
             setup=st_edit(shape_string)),
        Case("safetensors invalid JSON", gen("{tmp}/m"), needle="not valid JSON",
             setup=st_edit(lambda p: B.st_write_raw(p, b'{"a": ', b""))),
        Case("safetensors unknown dtype", gen("{tmp}/m"), needle="unknown dtype",
             setup=st_edit(lambda p: B.st_write_raw(p, b'{"x": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}}', b"\0"))),
        Case("safetensors offsets out of range", gen("{tmp}/m"), needle="out of range",
             setup=st_edit(lambda p: B.st_write_raw(p, b'{"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', b"\0" * 8))),
        Case("safetensors overlapping tensors", gen("{tmp}/m"), needle="overlap",
             setup=st_edit(lambda p: B.st_write_raw(
                 p, b'{"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
                    b'"y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}', b"\0" * 12))),
        Case("NaN in a bf16 weight", gen("{tmp}/m"), needle=["model.layers.1.mlp.down_proj.weight", "NaN", "[3, 7]"],
             setup=st_edit(lambda p: B.st_patch_element(p, "model.layers.1.mlp.down_proj.weight", 3 * 176 + 7, B.NAN["BF16"]))),
        Case("+inf in an f16 weight", gen("{tmp}/m"), needle=["model.layers.0.self_attn.k_proj.weight", "+inf"],
             setup=model_copy("tiny-fp16-tied", edit=lambda d: B.st_patch_element(
                 os.path.join(d, "model.safetensors"), "model.layers.0.self_attn.k_proj.weight", 5, B.INF["F16"]))),
        Case("NaN in a norm", gen("{tmp}/m"), needle=["model.norm.weight", "NaN"],
             setup=st_edit(lambda p: B.st_patch_element(p, "model.norm.weight", 0, B.NAN["BF16"]))),
        Case("NaN in the embedding, --quant w8a8", gen("{tmp}/m", "--quant", "w8a8"),
             needle=["model.embed_tokens.weight", "NaN"],
             setup=st_edit(lambda p: B.st_patch_element(p, "model.embed_tokens.weight", 64 * 300 + 1, B.NAN["BF16"]))),
        Case("unpadded header (unaligned tensor data) still loads", ["generate", "--model", "{tmp}/m", "--prompt-ids",
                                                                    "1,2,3,4", "--print-ids", "--max-new-tokens", "8"],
             rc=0, setup=st_edit(unpadded), check=lambda t, r: None if r.out.split()[:2] == ["205", "112"] else r.out),
        Case("missing tensor", gen("{tmp}/m"), needle="model.layers.1.mlp.up_proj.weight",
             setup=st_edit(lambda p: B.st_drop_tensor(p, "model.layers.1.mlp.up_proj.weight"))),
    ]

    # ---- config.json
    C += [
        Case("hidden_size 64.9", gen("{tmp}/m"), needle=["hidden_size", "64.9"], setup=model_copy(hidden_size=64.9)),
        Case("hidden_size as a string", gen("{tmp}/m"), needle="hidden_size", setup=model_copy(hidden_size="64")),
        Case("rope_scaling linear factor 0", gen("{tmp}/m"), needle="rope_scaling factor",
             setup=model_copy(rope_scaling={"type": "linear", "factor": 0})),
        Case("rope_scaling linear factor negative", gen("{tmp}/m"), needle="rope_scaling factor",
             setup=model_copy(rope_scaling={"type": "linear", "factor": -2.0})),
        Case("num_hidden_layers smaller than the checkpoint", gen("{tmp}/m"), needle=["num_hidden_layers", "layers up to 1"],
             setup=model_copy(num_hidden_layers=1)),
        Case("num_hidden_layers larger than the checkpoint", gen("{tmp}/m"), needle="model.layers.2.",
             setup=model_copy(num_hidden_layers=3)),
        Case("tie_word_embeddings beside a different lm_head", gen("{tmp}/m"), needle=["tie_word_embeddings", "lm_head"],
             setup=model_copy(tie_word_embeddings=True)),
        Case("vocab 2^31-1 with --random-weights", gen("{tmp}/m", "--random-weights"), needle=["vocab_size", "GiB"],
             setup=model_copy(vocab_size=2**31 - 1), logs_ok=True),
        Case("info on an absurd config", ["info", "--model", "{tmp}/m"], needle="parameters",
             setup=model_copy(hidden_size=2**31 - 64, intermediate_size=2**31 - 1, num_hidden_layers=1024,
                              num_attention_heads=1, num_key_value_heads=1, head_dim=64)),
        Case("info on a config that disagrees with the tensors", ["info", "--model", "{tmp}/m"], needle="shape",
             setup=model_copy(intermediate_size=200)),
        Case("config nested 100k deep", gen("{tmp}/m"), needle="nested deeper",
             setup=model_copy(edit=lambda d: B.write_config_text(d, "[" * 100000))),
        Case("config not JSON", gen("{tmp}/m"), needle="not valid JSON",
             setup=model_copy(edit=lambda d: B.write_config_text(d, "{hidden_size: 3"))),
        Case("config over 1 MiB", gen("{tmp}/m"), needle="byte limit",
             setup=model_copy(edit=lambda d: B.write_config_text(d, " " * (2 << 20)))),
        Case("eos id outside the vocab", gen("{tmp}/m"), needle="eos_token_id", setup=model_copy(eos_token_id=5000)),
        Case("unsupported attention_bias", gen("{tmp}/m"), needle="attention_bias", setup=model_copy(attention_bias=True)),
    ]

    # ---- GGUF
    def gguf_copy(edits_fn, name="m.gguf"):
        def setup(tmp):
            with open(gguf_f32, "rb") as f:
                b = f.read()
            B.gguf_patch(gguf_f32, os.path.join(tmp, name), edits_fn(b, B.gguf_layout(b)))
            return []
        return setup

    def freq_base_inf(b, lay):
        t, at = lay["kv"]["llama.rope.freq_base"]
        return [(at, struct.pack("<f", float("inf")))]

    def truncated_gguf(tmp):
        gguf_copy(lambda b, lay: [])(tmp)
        os.truncate(os.path.join(tmp, "m.gguf"), 5000)
        return []

    def lower_count(b, lay):
        return [(8, struct.pack("<Q", len(lay["tensors"]) - 1))]

    C += [
        Case("GGUF tensor count lowered", gen("{tmp}/m.gguf"), needle="tensor count", setup=gguf_copy(lower_count)),
        Case("GGUF rope.freq_base inf", gen("{tmp}/m.gguf"), needle="rope.freq_base", setup=gguf_copy(freq_base_inf)),
        Case("GGUF NaN in a tensor", gen("{tmp}/m.gguf"), needle=["blk.0.ffn_down.weight", "NaN"],
             setup=gguf_copy(lambda b, lay: [(B.gguf_element_offset(lay, "blk.0.ffn_down.weight", 9), B.NAN["F32"])])),
        Case("GGUF bad magic", gen("{tmp}/m.gguf"), needle="not a GGUF file", setup=gguf_copy(lambda b, lay: [(0, b"GGUX")])),
        Case("GGUF truncated", gen("{tmp}/m.gguf"), needle="m.gguf", setup=truncated_gguf),
        Case("GGUF kv count huge", gen("{tmp}/m.gguf"), needle="kv count",
             setup=gguf_copy(lambda b, lay: [(16, struct.pack("<Q", 2**62))])),
    ]
    def unsupported_type(b, lay):
        return [(lay["tensors"]["blk.0.attn_q.weight"][2] - 4, struct.pack("<I", 12))]  # ggml type field: q4_K

    def index_escape(d):
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            f.write('{"weight_map": {"model.norm.weight": "../../etc/passwd"}}')

    C += [
        Case("GGUF tensor of an unsupported type", gen("{tmp}/m.gguf"), needle=["blk.0.attn_q.weight", "q4_K"],
             setup=gguf_copy(unsupported_type)),
        Case("safetensors int8 weight", gen("{tmp}/m"), needle=["model.norm.weight", "dtype"],
             setup=st_edit(lambda p: B.st_write_raw(
                 p, b'{"model.norm.weight": {"dtype": "I8", "shape": [64], "data_offsets": [0, 64]}}', b"\0" * 64))),
        Case("index.json names a file outside the model", gen("{tmp}/m"), needle="not a file in the model directory",
             setup=model_copy("tiny-gqa-llama3", edit=index_escape)),
        Case("config of another architecture", gen("{tmp}/m"), needle="architecture 'gpt2' is not supported; supported: llama, mistral, qwen2",
             setup=model_copy(model_type="gpt2", architectures=["GPT2LMHeadModel"])),
        Case("model folder without weights", gen("{tmp}/m"), needle="no model.safetensors",
             setup=model_copy(edit=lambda d: os.remove(os.path.join(d, "model.safetensors")))),
        Case("--smooth is a FIFO", gen(llama2, "--quant", "w8a8", "--smooth", "{tmp}/s.st"), needle="FIFO",
             setup=lambda t: os.mkfifo(os.path.join(t, "s.st")) or [], logs_ok=True),
        Case("--prompt on a model without a tokenizer", ["generate", "--model", llama2, "--prompt", "hi"],
             needle="tokenizer"),
    ]
    return C + more_cases(shared, llama2, gen, model_copy)


def more_cases(shared, llama2, gen, model_copy):
    """Tokenizers, flags, generation limits, write errors, clobbering, signals, threads."""
    C = []
    ok_gen = ["generate", "--model", llama2, "--prompt-ids", "1,2,3,4", "--print-ids"]

    def greedy_equal(tmp, r):
        want = "205 112 191 215 79 43 94 75"  # tiny-llama2's greedy continuation of 1,2,3,4 (temperature 0)
        return None if r.out.split() == want.split() else f"tokens {r.out.strip()!r}, expected the greedy {want!r}"

    def odd_tokenizer_config(t):
        B.spm_json_without_fallback(os.path.join(t, "tokenizer.json"))
        with open(os.path.join(t, "tokenizer_config.json"), "w") as f:
            f.write('{"bos_token": 7, "eos_token": {"content": 3}, "add_bos_token": "yes", '
                    '"chat_template": [{"name": 5, "template": "x"}, 4]}')
        return []

    # ---- tokenizer
    C += [
        Case("vocab missing a character", ["tokenize", "--tokenizer", "{tmp}/tokenizer.json", "--text", "aZa"],
             needle="cannot encode", setup=lambda t: B.spm_json_without_fallback(os.path.join(t, "tokenizer.json")) and []),
        Case("tokenizer.json nested deep", ["tokenize", "--tokenizer", "{tmp}/tokenizer.json", "--text", "a"],
             needle="nested deeper", setup=lambda t: open(os.path.join(t, "tokenizer.json"), "w").write("[" * 50000) and []),
        Case("tokenizer_config.json with odd value types is read, not a crash",
             ["tokenize", "--tokenizer", "{tmp}", "--text", "ab"], rc=0, setup=odd_tokenizer_config,
             check=lambda t, r: None if r.out.split() == ["5", "4"] else f"ids {r.out!r}"),
        Case("tokenize with neither --text nor --decode", ["tokenize", "--tokenizer", DEFAULT_MODEL], rc=2,
             needle="--text"),
        Case("tokenize --decode id outside the vocab", ["tokenize", "--tokenizer", DEFAULT_MODEL, "--decode", "1,99999999"],
             needle="99999999"),
    ]

    # ---- flags: every one has a range; the error names the flag and the range (exit 2)
    flag = lambda *a: Case(f"flag {' '.join(a)}", gen(llama2, *a), rc=2, needle=a[0])
    C += [flag("--threads", "-1"), flag("--threads", "1000000"), flag("--max-seq", "-5"), flag("--micro-batch", "-3"),
          flag("--tp", "0"), flag("--pp", "-1"), flag("--seed", "-1"), flag("--seed", "18446744073709551616"),
          flag("--max-new-tokens", "99999999999999999999"), flag("--comm-timeout", "0.000001"), flag("--start-timeout", "0"),
          flag("--temperature", "nan"), flag("--temperature", "-1"), flag("--top-p", "0"), flag("--top-k", "-2"),
          flag("--batch", "0"), flag("--max-batch-tokens", "0"), flag("--seed-weights", "-7"),
          flag("--system", "be brief"), flag("--no-such-flag"), flag("--dtype", "f8"), flag("--batch", "2000"), flag("--top-p", "1.5")]
    C += [
        Case("--pp-layers a,b", gen(llama2, "--pp-layers", "a,b"), needle="--pp-layers"),
        Case("layout --tp 0", ["layout", "--tp", "0"], rc=2, needle="--tp"),
        Case("layout --nodes 0", ["layout", "--tp", "1", "--nodes", "0"], rc=2, needle="--nodes"),
        Case("--devices x", gen(llama2, "--devices", "0,x"), needle="--devices"),
        Case("--dtype f16 on the CPU", gen(llama2, "--device", "cpu", "--dtype", "f16"), needle="--dtype f16"),
        Case("--dtype f32 on CUDA", gen(llama2, "--device", "cuda", "--dtype", "f32"), needle="--dtype f32"),
        Case("--dtype bf16 on the CPU runs, its cache bf16", gen(llama2, "--device", "cpu", "--dtype", "bf16"), rc=0,
             needle="blocks of 16 = 8.0 MiB, bf16)"),
        Case("--prompt-ids with a negative id", gen(llama2)[:4] + ["1,-5"], needle="-5"),
        Case("--prompt-ids empty", gen(llama2)[:4] + [","], needle="prompt"),
        Case("calibrate --window 0", ["calibrate", "--text", "/etc/hostname", "--out", "{tmp}/o", "--window", "0"], rc=2,
             needle="--window"),
        Case("unknown preset", ["generate", "--random-weights", "--config", "llama-9", "--prompt-ids", "1"],
             needle="llama-9"),
        Case("--threads 10000 is capped, with a warning", ok_gen + ["--max-new-tokens", "8", "--threads", "10000"], rc=0,
             needle="--threads 10000", check=greedy_equal),
        Case("thread creation fails", gen(llama2, "--threads", "2"), needle="CPU threads", needs_cores=2,
             needs_alloc_failure=True, extra_limits=((resource.RLIMIT_STACK, 2 << 30),), logs_ok=True),
        Case("random llama-2-7b under the memory limit", ["generate", "--random-weights", "--config", "llama-2-7b",
                                                          "--prompt-ids", "1", "--max-seq", "16"],
             needle="out of memory", needs_alloc_failure=True, logs_ok=True),
    ]

    # ---- generation limits
    C += [
        Case("--temperature 1e-38 samples the argmax", ok_gen + ["--max-new-tokens", "8", "--temperature", "1e-38"],
             rc=0, check=greedy_equal),
        Case("prompt fills the context", ok_gen + ["--max-seq", "4"], needle="fills the whole context", logs_ok=True),
        Case("prompt leaves room for fewer tokens", ok_gen + ["--max-seq", "6", "--max-new-tokens", "5"], rc=0,
             needle="room for 2 of the 5",
             check=lambda t, r: None if r.out.split() == ["205", "112"] else f"output {r.out!r}"),
        Case("prompt longer than the context", ok_gen + ["--max-seq", "3"], needle="longer than the model", logs_ok=True),
        Case("token id outside the vocab", gen(llama2)[:4] + ["1,320"], needle="320", logs_ok=True),
    ]

    # ---- write errors: every write and the final flush checked, exit 1 naming the file
    C += [
        Case("--stats-json /dev/full", gen(llama2, "--stats-json", "/dev/full"), needle="/dev/full",
             check=kind_is("/dev/full", stat.S_ISCHR, "a character device")),
        Case("--stats-json FIFO without a reader", gen(llama2, "--stats-json", "{tmp}/fifo"), needle="FIFO",
             setup=lambda t: os.mkfifo(os.path.join(t, "fifo")) or [], check=kind_is("fifo", stat.S_ISFIFO, "a FIFO")),
        Case("--stats-json in a missing folder", gen(llama2, "--stats-json", "{tmp}/no/s.json"), needle="does not exist"),
        Case("generate, stdout on a full disk", gen(llama2), stdout="full", needle="stdout", logs_ok=True),
        Case("generate, stdout closed", gen(llama2), stdout="closed", needle="stdout", logs_ok=True),
        Case("generate text, stdout closed", ["generate", "--prompt", "Hi", "--max-new-tokens", "2"], stdout="closed",
             needle="stdout", logs_ok=True),
        Case("tokenize, stdout on a full disk", ["tokenize", "--tokenizer", DEFAULT_MODEL, "--text", "hello"],
             stdout="full", needle="stdout"),
        Case("tokenize, stdout closed", ["tokenize", "--tokenizer", DEFAULT_MODEL, "--text", "hello"], stdout="closed",
             needle="stdout"),
        Case("generate, stderr on a full disk", ok_gen + ["--max-new-tokens", "8"], rc=0, stderr="full",
             check=greedy_equal),
        Case("an error with stderr on a full disk still exits 1", gen("{tmp}/nope"), stderr="full"),
        Case("info, stdout on a full disk", ["info", "--model", llama2], stdout="full", needle="stdout"),
    ]

    # ---- clobbering: atomic outputs only over regular files or new paths
    score = ["score", "--model", llama2, "--prompt-ids", "1,2,3"]

    def link_setup(t):
        with open(os.path.join(t, "target"), "wb") as f:
            f.write(b"keep")
        os.symlink("target", os.path.join(t, "link"))
        return []

    def old_file(name):
        def setup(t):
            with open(os.path.join(t, name), "w") as f:
                f.write('{"generated_tokens": 99}')
            return []
        return setup

    def batch_lines(first):
        """setup(): tmp/in.jsonl holding `first`, then a valid line (the job must go on after it)."""
        def setup(t):
            with open(os.path.join(t, "in.jsonl"), "w") as f:
                f.write(first + "\n" + '{"prompt": [1, 2], "max_tokens": 2}\n')
            return []
        return setup

    def batch_records(codes):
        """check(): tmp/o.jsonl holds one record per line, line-N's error code codes[N-1] (None: a result)."""
        def check(tmp, r):
            with open(os.path.join(tmp, "o.jsonl")) as f:
                recs = {j["custom_id"]: j for j in map(json.loads, f)}
            got = [(recs.get(f"line-{i + 1}") or {}).get("error") or {} for i in range(len(codes))]
            got = [g.get("code") for g in got]
            missing = [i + 1 for i in range(len(codes)) if f"line-{i + 1}" not in recs]
            return f"records {got}, missing lines {missing}" if got != codes or missing or len(recs) != len(codes) \
                else None
        return check

    def weights_intact(tmp, r):
        with open(os.path.join(llama2, "model.safetensors"), "rb") as a, \
                open(os.path.join(tmp, "m", "model.safetensors"), "rb") as b:
            return None if a.read() == b.read() else "the model's weights were changed"

    def valid_logits(tmp, r):
        h, data = B.st_read(os.path.join(tmp, "out.st"))
        return None if h["logits"]["shape"] == [3, 320] and len(data) == 3 * 320 * 4 else f"bad output header {h}"

    C += [
        Case("score --out FIFO", score + ["--out", "{tmp}/fifo"], needle="FIFO",
             setup=lambda t: os.mkfifo(os.path.join(t, "fifo")) or [], check=kind_is("fifo", stat.S_ISFIFO, "a FIFO")),
        Case("score --out symlink", score + ["--out", "{tmp}/link"], needle="symbolic link", setup=link_setup,
             check=all_of(kind_is("link", stat.S_ISLNK, "a symlink"), content_is("target", b"keep"))),
        Case("score --out /dev/full", score + ["--out", "/dev/full"], needle="character device",
             check=kind_is("/dev/full", stat.S_ISCHR, "a character device")),
        Case("score --out a directory", score + ["--out", "{tmp}/d"], needle="directory",
             setup=lambda t: os.mkdir(os.path.join(t, "d")) or [], check=kind_is("d", stat.S_ISDIR, "a directory")),
        Case("score --out over a regular file", score + ["--out", "{tmp}/out.st"], rc=0, setup=old_file("out.st"),
             check=valid_logits),
        Case("failed score removes the previous --out", score[:4] + ["1,999", "--out", "{tmp}/out.st"], needle="999",
             setup=old_file("out.st"), check=absent("out.st"), logs_ok=True),
        Case("score --out names the model's own weights", ["score", "--model", "{tmp}/m", "--prompt-ids", "1,2",
                                                          "--out", "{tmp}/m/model.safetensors"],
             needle="input of this run", setup=model_copy(), check=weights_intact),
        Case("score --out names a hard link of the model's weights", ["score", "--model", "{tmp}/m", "--prompt-ids",
                                                                     "1,2", "--out", "{tmp}/w.st"],
             needle="input of this run", setup=model_copy(edit=lambda d: os.link(os.path.join(d, "model.safetensors"),
                                                                                os.path.join(d, "..", "w.st"))),
             check=weights_intact),
        Case("calibrate --out names its --text", ["calibrate", "--model", DEFAULT_MODEL, "--text", "{tmp}/t.txt",
                                                  "--out", "{tmp}/t.txt"],
             needle="input of this run", setup=old_file("t.txt"), check=content_is("t.txt", b'{"generated_tokens": 99}')),
        Case("batch --input missing", ["batch", "--model", llama2, "--input", "{tmp}/none.jsonl", "--output",
                                       "{tmp}/o.jsonl"], needle="none.jsonl: no such file", check=absent("o.jsonl")),
        Case("batch --input is a FIFO", ["batch", "--model", llama2, "--input", "{tmp}/fifo", "--output",
                                         "{tmp}/o.jsonl"], needle="FIFO", setup=lambda t: os.mkfifo(os.path.join(t, "fifo")) or []),
        Case("batch --output names its --input", ["batch", "--model", llama2, "--input", "{tmp}/t.txt", "--output",
                                                  "{tmp}/t.txt"],
             needle="input of this run", setup=old_file("t.txt"), check=content_is("t.txt", b'{"generated_tokens": 99}')),
        Case("batch --output is a FIFO: refused as an appended file",
             ["batch", "--model", llama2, "--input", "{tmp}/t.txt", "--output", "{tmp}/fifo"],
             needle=["--output", "FIFO", "appended to a regular file"],
             setup=lambda t: os.mkfifo(os.path.join(t, "fifo")) or old_file("t.txt")(t),
             check=all_of(kind_is("fifo", stat.S_ISFIFO, "a FIFO"),
                          lambda t, r: "said temporary file + rename" if "temporary file" in r.err else None)),
        Case("batch --output's fingerprint (OUTPUT.input) names its --input",
             ["batch", "--model", llama2, "--input", "{tmp}/o.jsonl.input", "--output", "{tmp}/o.jsonl"],
             needle=["o.jsonl.input", "input of this run"], setup=old_file("o.jsonl.input"),
             check=content_is("o.jsonl.input", b'{"generated_tokens": 99}')),
        Case("batch: a 60 MB line (12M token ids) is an error record, at little memory",
             ["batch", "--model", llama2, "--input", "{tmp}/in.jsonl", "--output", "{tmp}/o.jsonl", "--progress",
              "none"], rc=0, max_rss_mb=160, logs_ok=True,
             setup=batch_lines('{"prompt": [' + "123, " * (12 << 20) + '1], "max_tokens": 2}'),
             check=batch_records(["request_too_large", None])),
        Case("batch: a 20 MB line of nested [ is an error record, at little memory",
             ["batch", "--model", llama2, "--input", "{tmp}/in.jsonl", "--output", "{tmp}/o.jsonl", "--progress",
              "none"], rc=0, max_rss_mb=160, logs_ok=True, setup=batch_lines('{"prompt": ' + "[" * (20 << 20)),
             check=batch_records(["request_too_large", None])),
        Case("batch: --kv-cache-gb 0.02 (29 blocks), a chat line without max_tokens runs",
             ["batch", "--input", "{tmp}/in.jsonl", "--output", "{tmp}/o.jsonl", "--progress", "none",
              "--kv-cache-gb", "0.02", "--threads", "2"], rc=0, logs_ok=True,
             needle="the KV cache holds 464 positions (29 blocks of 16), fewer than the context of 4096",
             setup=lambda t: open(os.path.join(t, "in.jsonl"), "w").write(
                 '{"messages": [{"role": "user", "content": "Hi"}], "temperature": 0}\n') and [],
             check=lambda t, r: None if json.load(open(os.path.join(t, "o.jsonl")))["response"]["body"]["object"]
             == "chat.completion" else open(os.path.join(t, "o.jsonl")).read()),
        Case("batch --stats-json names the model's weights", ["batch", "--model", "{tmp}/m", "--input", "{tmp}/t.txt",
                                                              "--output", "{tmp}/o.jsonl", "--stats-json",
                                                              "{tmp}/m/model.safetensors"],
             needle="input of this run", setup=lambda t: model_copy()(t) + old_file("t.txt")(t), check=weights_intact),
        Case("calibrate --out symlink", ["calibrate", "--model", llama2, "--text", "/etc/hostname", "--out", "{tmp}/link"],
             needle="symbolic link", setup=link_setup,
             check=all_of(kind_is("link", stat.S_ISLNK, "a symlink"), content_is("target", b"keep"))),
    ]

    # ---- signals: a run stopped mid-generation leaves no stale stats file and no temporary file
    def stop_after_first_token(sig):
        def on_start(p, tmp):
            if not p.stdout.read(1):  # blocks until the first token is printed (or the process ends)
                return
            os.kill(p.pid, sig)
        return on_start

    for sig in (signal.SIGTERM, signal.SIGINT):
        C.append(Case(f"{sig.name} mid-generation leaves no stale --stats-json",
                      ["generate", "--prompt", "Tell me a long story.", "--max-new-tokens", "400", "--ignore-eos",
                       "--stats-json", "{tmp}/stats.json"],
                      rc=-sig, stdout="pipe", setup=old_file("stats.json"), check=absent("stats.json"), logs_ok=True,
                      on_start=stop_after_first_token(sig)))
    return C
