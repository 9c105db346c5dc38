#!/usr/bin/env bash
# Stock lm-evaluation-harness (`lm_eval --model local-completions`, PyPI's lm-eval[api], no torch) on a
# small local multiple-choice task against `lattice serve`: what a user who evaluates models with lm-eval
# runs. Not part of the test suite (it needs PyPI); test_serve_clients.py replays lm-eval's payloads and
# parsing without it.
#   scripts/lm_eval_local.sh [MODEL]          (default: the built-in model)
# Environment: LATTICE (the binary; default build/launch/lattice), LM_EVAL_VENV (default
# build/lm-eval-venv: made and filled once with `pip install "lm-eval[api]==$LM_EVAL_VERSION"`),
# LM_EVAL_VERSION (0.4.13), THREADS (2).
# The task: 12 questions of general knowledge, 4 choices each, scored by loglikelihood (lm-eval sends
# echo + logprobs 1 + max_tokens 1 per choice and sums token_logprobs[ctxlen:-1]); its tokenizer is the
# server's (/tokenizer_info, /tokenize). Prints lm-eval's table; exit 0 when lm-eval ran and reported acc.
set -euo pipefail
cd "$(dirname "$0")/.."
LATTICE=${LATTICE:-build/launch/lattice}
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
VENV=${LM_EVAL_VENV:-build/lm-eval-venv}
VERSION=${LM_EVAL_VERSION:-0.4.13}
THREADS=${THREADS:-2}

if [[ ! -x $VENV/bin/lm_eval ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "lm-eval[api]==$VERSION"
fi

work=$(mktemp -d)
server=""
cleanup() {
    if [[ -n $server ]]; then kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

python3 - "$work/mc.jsonl" <<'EOF'
import json, sys
qs = [("What is the capital of France?", ["Paris", "London", "Rome", "Berlin"], 0),
      ("What color is the sky on a clear day?", ["Green", "Blue", "Red", "Black"], 1),
      ("How many legs does a spider have?", ["Six", "Four", "Eight", "Ten"], 2),
      ("Which animal is known as the king of the jungle?", ["Mouse", "Cow", "Fish", "Lion"], 3),
      ("What do bees make?", ["Honey", "Milk", "Silk", "Bread"], 0),
      ("What is frozen water called?", ["Steam", "Ice", "Sand", "Glass"], 1),
      ("Which planet do we live on?", ["Mars", "Venus", "Earth", "Jupiter"], 2),
      ("How many days are in a week?", ["Five", "Six", "Ten", "Seven"], 3),
      ("What gas do plants take in from the air?", ["Carbon dioxide", "Helium", "Neon", "Argon"], 0),
      ("What is the largest ocean on Earth?", ["Arctic", "Pacific", "Indian", "Atlantic"], 1),
      ("Which fruit is yellow and curved?", ["Apple", "Grape", "Banana", "Cherry"], 2),
      ("What do you call a baby cat?", ["Puppy", "Calf", "Foal", "Kitten"], 3)]
with open(sys.argv[1], "w") as f:
    for q, c, a in qs:
        f.write(json.dumps({"question": q, "choices": c, "answer": a}) + "\n")
EOF
cat > "$work/lattice_mc.yaml" <<EOF
task: lattice_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: $work/mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{question}}\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
EOF

"$LATTICE" serve --model "$MODEL" --port 0 --threads "$THREADS" > "$work/serve.out" 2> "$work/serve.err" &
server=$!
port=""
for _ in $(seq 600); do
    port=$(sed -n 's|^lattice serve: listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$work/serve.out")
    if [[ -n $port ]] && curl -sf "http://127.0.0.1:$port/health" > /dev/null; then break; fi
    sleep 0.2
done
[[ -n $port ]] || { cat "$work/serve.err" >&2; exit 1; }
name=$(curl -s "http://127.0.0.1:$port/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')

HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$VENV/bin/lm_eval" --model local-completions \
    --model_args "model=$name,base_url=http://127.0.0.1:$port/v1/completions,num_concurrent=1,max_retries=1,tokenizer_backend=remote,tokenized_requests=True" \
    --tasks lattice_mc --include_path "$work" --batch_size 4 --output_path "$work/out" 2>&1 | tee "$work/lm_eval.log"
grep -q "acc" "$work/lm_eval.log"
