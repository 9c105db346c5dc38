#!/usr/bin/env bash
# `lattice convert` and `lattice verify` as users drive them: a converted folder generates the same
# tokens as its original (one rank, and tp 2 under mpirun after a parallel conversion), verify says
# "ok" per file (the manifest's own content first: its seal) and exits 0, names a corrupted file and
# exits 1, names an edited manifest (hidden_size, layer count, vocab, quant mode: each value valid) and
# exits 1, and says an unsealed manifest is unchecked, a folder of another layout is one
# clear line naming the layout it holds, --verify catches a flipped byte at load (weights and
# tokenizer; a token renamed in a same-size tokenizer), progress lines when stderr is not a terminal, SIGTERM leaves no partial folder and a dead
# conversion's partial folder is removed by the next one, the default (Q4_1 GGUF) model converts with --quant auto (w4a8) and keeps
# its tokenizer (text in, same text out).
# Usage: test_convert.sh LATTICE_BINARY SHARED_DIR DEFAULT_MODEL
set -u
lattice=$1
shared=$2
default_model=$3
source "$(dirname "$0")/check_lib.sh"

g=$shared/golden/tiny-gqa-llama3
prompt=$(python3 -c "import json; print(','.join(map(str, json.load(open('$g/expected.json'))['cases'][1]['prompt_ids'])))")
gen() { "$lattice" generate --prompt-ids "$prompt" --max-new-tokens 16 --ignore-eos --print-ids --threads 1 "$@" 2>"$tmp/gen.err"; }

# One rank: convert, verify, generate the same tokens as the original (-m and -t as in every command).
"$lattice" convert -m "$g" --out "$tmp/c1" --quant w8a8 >"$tmp/convert.out" 2>"$tmp/convert.err"
check "convert exits 0" test $? -eq 0
check "convert prints progress lines when stderr is not a terminal" grep -q "^convert: .* GiB .* MB/s, ETA" "$tmp/convert.err"
check "convert's last line names the folder and the peak memory" grep -q "converted .* -> $tmp/c1: .*peak resident memory" "$tmp/convert.out"
check "the folder holds the manifest and one rank file" test -f "$tmp/c1/manifest.json" -a -f "$tmp/c1/rank-00000-of-00001.safetensors"
check "no partial folder is left" test -z "$(ls -A "$tmp" | grep partial)"
out=$("$lattice" verify -t 1 "$tmp/c1"); rc=$?
check "verify exits 0 on an intact folder" test $rc -eq 0
check "verify prints ok per file" grep -q "^ok *rank-00000-of-00001.safetensors" <<<"$out"
check "verify checks the manifest's content first" test "$(head -1 <<<"$out")" = \
    "ok       manifest.json (its content matches its manifest_sha256)"
check "verify counts the manifest among the intact files" grep -q "c1: 2 of 2 files intact (" <<<"$out"

# An edited manifest (each value valid, so only the seal can tell): verify names it
# and exits 1 (the other files still checked), a load refuses it naming it; without its seal
# (an older conversion) verify says unchecked, never intact.
cp -r "$tmp/c1" "$tmp/c1e"
for edit in hidden_size=256 layers=5 vocab_size=300 mode=w8a16; do
    python3 - "$tmp/c1/manifest.json" "$tmp/c1e/manifest.json" "$edit" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
k, v = sys.argv[3].split("=")
if k == "layers":
    m["config"]["num_hidden_layers"] = int(v)
    m["layout"]["stage_layers"] = [int(v)]
elif k == "mode":
    m["quantization"]["mode"] = v
else:
    m["config"][k] = int(v)
json.dump(m, open(sys.argv[2], "w"), indent=2)
PY
    out=$("$lattice" verify "$tmp/c1e" 2>&1); rc=$?
    check "verify exits 1 on a manifest edited ($edit)" test $rc -eq 1
    check "... naming the manifest first" grep -q "^CORRUPT  manifest.json: the SHA-256 of its content" <<<"$(head -1 <<<"$out")"
    check "... and still checking the files" grep -q "^ok *rank-00000-of-00001.safetensors" <<<"$out"
    check "... its error line counts it" grep -q "1 corrupt or missing file(s)" <<<"$out"
    out=$(gen --model "$tmp/c1e" 2>&1; cat "$tmp/gen.err")
    check "a load refuses the edited manifest ($edit), naming it" \
        grep -q "c1e/manifest.json: the SHA-256 of its content, .* edited or damaged" <<<"$out"
done
python3 -c "
import json, sys; m = json.load(open('$tmp/c1/manifest.json')); del m['manifest_sha256']
json.dump(m, open('$tmp/c1e/manifest.json', 'w'))"
out=$("$lattice" verify "$tmp/c1e" 2>&1); rc=$?
check "verify of an unsealed manifest exits 0 (every file it lists intact)" test $rc -eq 0
check "... saying the manifest is unchecked" grep -q "^UNCHECKED manifest.json: no manifest_sha256" <<<"$out"
check "... and not counting it intact" grep -q "c1e: 1 of 1 files intact; manifest.json unchecked" <<<"$out"
out=$(gen --model "$tmp/c1e" --verify 2>&1; cat "$tmp/gen.err")
check "--verify warns that an unsealed manifest is not checked" grep -q "manifest.json has no manifest_sha256" <<<"$out"
want=$(gen --model "$g" --quant w8a8)
got=$(gen --model "$tmp/c1" --verify)
check "converted w8a8 (quant auto) generates the original's w8a8 tokens" test -n "$want" -a "$got" = "$want"

# Another layout: one line naming what the folder holds.
out=$("${mpirun[@]}" -np 2 "$lattice" generate --model "$tmp/c1" --tp 2 --prompt-ids 1,2 --max-new-tokens 2 2>&1); rc=$?
check "loading a tp 1 folder at tp 2 fails" test $rc -ne 0
check "the error names the layout the folder holds" grep -q "converted for tp 1 x pp 1 (1 rank(s), quant w8a8), but this run is tp 2 x pp 1" <<<"$out"
out=$(gen --model "$tmp/c1" --quant w8a16 2>&1; cat "$tmp/gen.err"); 
check "a contradicting --quant is refused" grep -q "converted with --quant w8a8, but this run asks for --quant w8a16" <<<"$out"

# tp 2 under mpirun: both ranks convert (a file each), then load only their own file.
"${mpirun[@]}" -np 2 "$lattice" convert --model "$g" --out "$tmp/c2" --tp 2 --quant w8a16 --progress none >/dev/null 2>"$tmp/c2.err"
check "parallel convert exits 0" test $? -eq 0
check "two rank files" test -f "$tmp/c2/rank-00000-of-00002.safetensors" -a -f "$tmp/c2/rank-00001-of-00002.safetensors"
want=$("${mpirun[@]}" -np 2 "$lattice" generate --model "$g" --tp 2 --quant w8a16 --prompt-ids "$prompt" --max-new-tokens 16 --ignore-eos --print-ids --threads 1 2>/dev/null)
got=$("${mpirun[@]}" -np 2 "$lattice" generate --model "$tmp/c2" --tp 2 --prompt-ids "$prompt" --max-new-tokens 16 --ignore-eos --print-ids --threads 1 2>/dev/null)
check "tp 2 converted generates the original's tp 2 tokens" test -n "$want" -a "$got" = "$want"

# Corruption: verify names the file and exits 1; --verify refuses to load it.
python3 - "$tmp/c2/rank-00001-of-00002.safetensors" <<'PY'
import os, sys
p = sys.argv[1]; n = os.path.getsize(p)
with open(p, 'r+b') as f:
    f.seek(n - 33); b = f.read(1); f.seek(n - 33); f.write(bytes([b[0] ^ 1]))
PY
out=$("$lattice" verify "$tmp/c2" 2>&1); rc=$?
check "verify exits 1 on a corrupt folder" test $rc -eq 1
check "verify names the corrupt file" grep -q "^CORRUPT *rank-00001-of-00002.safetensors: SHA-256" <<<"$out"
check "verify says the other file is ok" grep -q "^ok *rank-00000-of-00002.safetensors" <<<"$out"
check "verify's error line counts the bad files" grep -q "1 corrupt or missing file(s)" <<<"$out"
out=$("${mpirun[@]}" -np 2 "$lattice" generate --model "$tmp/c2" --tp 2 --verify --prompt-ids 1,2 --max-new-tokens 2 2>&1); rc=$?
check "--verify refuses the corrupt rank file" test $rc -ne 0
check "--verify's error names the file" grep -q "rank-00001-of-00002.safetensors: SHA-256 .* the file is corrupt" <<<"$out"

# Converting into an existing folder is refused.
out=$("$lattice" convert --model "$g" --out "$tmp/c1" 2>&1); rc=$?
check "convert refuses an existing --out" test $rc -eq 1
check "... saying so" grep -q "already exists" <<<"$out"

# The default model (Q4_1 GGUF): --quant auto converts to w4a8 (its Q4_1 blocks kept) with an int8 head, as a
# CPU run of the GGUF with --quant auto runs it; text round trip.
if [ -f "$default_model" ]; then
    "$lattice" convert --model "$default_model" --out "$tmp/smol" --progress lines >/dev/null 2>&1
    check "default model converts" test -f "$tmp/smol/tokenizer.gguf"
    check "its manifest says w4a8 with an int8 head" python3 -c "
import json; q = json.load(open('$tmp/smol/manifest.json'))['quantization']
assert q['mode'] == 'w4a8' and q['quant_head'] is True, q"
    want=$("$lattice" generate --model "$default_model" --prompt "The capital of France is" --max-new-tokens 8 \
        --threads 1 2>/dev/null)
    got=$("$lattice" generate --model "$tmp/smol" --prompt "The capital of France is" --max-new-tokens 8 --threads 1 2>/dev/null)
    check "converted default model answers the same text" test -n "$want" -a "$got" = "$want"
    # SIGTERM mid-conversion: exit non-zero, no partial folder left. A partial folder of a dead pid
    # (a SIGKILLed conversion) is removed, and said, when the next conversion to that name starts.
    # The dead pid: a child's, reaped. (A pid merely unused now may be handed to the conversion's own
    # threads a moment later, kill(pid, 0) then finds it alive, and the folder stays: seen once in CI.)
    sh -c 'exit 0' &
    dead=$!
    wait $dead
    mkdir -p "$tmp/.smol2.partial-$dead" && : >"$tmp/.smol2.partial-$dead/rank-00000-of-00001.safetensors"
    "$lattice" convert --model "$default_model" --out "$tmp/smol2" >/dev/null 2>"$tmp/sig.err" &
    pid=$!
    for _ in $(seq 1 2000); do  # until its own partial folder exists (bounded poll, not an ordering sleep)
        [ -n "$(ls -d "$tmp"/.smol2.partial-$pid 2>/dev/null)" ] && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.01
    done
    kill -TERM $pid 2>/dev/null
    wait $pid; rc=$?
    check "convert stopped by SIGTERM exits non-zero" test $rc -ne 0
    check "... leaves no partial folder" test -z "$(ls -d "$tmp"/.smol2.partial-* 2>/dev/null)"
    check "... and removed the dead pid's, saying so" grep -q "partial-$dead.*interrupted conversion" "$tmp/sig.err"
    check "... and no output folder" test ! -e "$tmp/smol2"
    # A tampered tokenizer (same size) is caught by --verify, which checks every file the text goes
    # through: the token "ĠParis" renamed "ĠRome!" (a load without --verify
    # answers "Rome!").
    python3 - "$tmp/smol/tokenizer.gguf" <<'PY'
import struct, sys
p = sys.argv[1]
b = open(p, 'rb').read()
old, new = "\u0120Paris".encode(), "\u0120Rome!".encode()
old = struct.pack("<Q", len(old)) + old  # the whole token (a GGUF string: u64 length, bytes)
assert b.count(old) == 1, "no single Paris token"
open(p, 'wb').write(b.replace(old, struct.pack("<Q", len(new)) + new))
PY
    out=$("$lattice" generate --model "$tmp/smol" --verify --prompt-ids 1,2 --max-new-tokens 2 --threads 1 2>&1); rc=$?
    check "--verify refuses a tampered tokenizer" test $rc -ne 0
    check "... naming it" grep -q "tokenizer.gguf: SHA-256 .* the file is corrupt" <<<"$out"
else
    echo "FAILED: $default_model missing (scripts/setup.sh fetches it)"; fail=$((fail + 1))
fi

finish test_convert.sh
