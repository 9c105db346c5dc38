"""Builders of hostile inputs for test_bad_input.py (Python 3, stdlib only): safetensors files read,
rewritten and corrupted; GGUF files parsed just enough to patch a count, a metadata value or one
tensor element; model folders copied from ../shared/golden with a changed config; small
tokenizer.json files. Nothing here runs lattice.
"""
import json
import os
import shutil
import struct

# ---- safetensors -------------------------------------------------------------------------------

ELEM = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "I32": 4, "I64": 8}
# A NaN / +inf bit pattern per dtype, little-endian.
NAN = {"F32": struct.pack("<I", 0x7FC00000), "F16": struct.pack("<H", 0x7E00), "BF16": struct.pack("<H", 0x7FC0)}
INF = {"F32": struct.pack("<I", 0x7F800000), "F16": struct.pack("<H", 0x7C00), "BF16": struct.pack("<H", 0x7F80)}


def st_read(path):
    """-> (header dict, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def st_write_raw(path, header_bytes, data=b"", length=None):
    """Writes a safetensors image with a given header text (and optionally a lying length)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes) if length is None else length))
        f.write(header_bytes)
        f.write(data)


def st_write(path, header, data):
    st_write_raw(path, json.dumps(header).encode(), data)


def st_patch_element(path, tensor, index, raw):
    """Overwrites element `index` (flat) of `tensor` with the bytes `raw`."""
    header, data = st_read(path)
    e = header[tensor]
    at = e["data_offsets"][0] + index * ELEM[e["dtype"]]
    data = data[:at] + raw + data[at + len(raw):]
    st_write(path, header, data)


def st_drop_tensor(path, tensor):
    header, data = st_read(path)
    del header[tensor]
    st_write(path, header, data)


# ---- model folders -----------------------------------------------------------------------------

def copy_model(shared, name, dst):
    """Copies ../shared/golden/<name> (config, weights; not the reference outputs) to dst."""
    shutil.copytree(os.path.join(shared, "golden", name), dst, ignore=shutil.ignore_patterns("expected*"))
    return dst


def edit_config(model_dir, **changes):
    """Sets (value) or deletes (value None) config.json fields."""
    p = os.path.join(model_dir, "config.json")
    with open(p) as f:
        c = json.load(f)
    for k, v in changes.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    with open(p, "w") as f:
        json.dump(c, f)


def write_config_text(model_dir, text):
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        f.write(text)


# ---- GGUF --------------------------------------------------------------------------------------

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 3: (32, 20)}  # ggml type: (elems, bytes)


def gguf_layout(b):
    """-> dict: kv {key: (type, value offset)}, tensors {name: (ggml type, ne, offset field pos, offset)},
    data (absolute offset of the data section)."""
    pos = 24

    def u(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, b, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def s():
        nonlocal pos
        n = u("Q")
        pos += n
        return b[pos - n:pos].decode("utf-8", "replace")

    def skip_value(t):
        nonlocal pos
        if t == 8:
            s()
        elif t == 9:
            et, n = u("I"), u("Q")
            for _ in range(n):
                skip_value(et)
        else:
            pos += _SCALAR[t]

    n_tensors, n_kv = struct.unpack_from("<QQ", b, 8)
    kv, tensors, align = {}, {}, 32
    for _ in range(n_kv):
        k = s()
        t = u("I")
        kv[k] = (t, pos)
        if k == "general.alignment":
            align = struct.unpack_from("<I", b, pos)[0]
        skip_value(t)
    for _ in range(n_tensors):
        name = s()
        ne = [u("Q") for _ in range(u("I"))]
        t = u("I")
        tensors[name] = (t, ne, pos, u("Q"))
    return {"kv": kv, "tensors": tensors, "data": (pos + align - 1) // align * align, "infos_end": pos}


def gguf_patch(src, dst, edits):
    """Copies src to dst applying (absolute offset, bytes) edits."""
    with open(src, "rb") as f:
        b = bytearray(f.read())
    for at, raw in edits:
        b[at:at + len(raw)] = raw
    with open(dst, "wb") as f:
        f.write(b)


def gguf_element_offset(layout, tensor, index):
    t, ne, _, off = layout["tensors"][tensor]
    assert t in (0, 1, 30), "only plain float tensors are patched element-wise"
    return layout["data"] + off + index * _BLOCK[t][1]


# ---- tokenizers --------------------------------------------------------------------------------

def spm_json_without_fallback(path):
    """A SentencePiece-style tokenizer.json whose vocab lacks "Z": no byte fallback, no unk token."""
    vocab = {"<s>": 0, "</s>": 1, "\u2581": 2, "a": 3, "b": 4, "\u2581a": 5}
    tok = {"model": {"type": "BPE", "byte_fallback": False, "vocab": vocab, "merges": ["\u2581 a"]},
           "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                              {"type": "Replace", "pattern": {"String": " "},
                                                               "content": "\u2581"}]},
           "added_tokens": [{"id": 0, "content": "<s>", "special": True}, {"id": 1, "content": "</s>", "special": True}]}
    with open(path, "w") as f:
        json.dump(tok, f)
    return path
