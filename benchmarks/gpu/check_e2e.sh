# The e2e step of benchmarks/gpu/check.sh (sourced): `lattice generate` on the CUDA backend with random
# TinyLlama-1.1B weights in W8A8, 64 tokens at batch 1 (half the step's time at most) and batch 8, each
# run's stats JSON kept in e2e.json. Without a GPU lattice must refuse (SKIP), never succeed.
e2e_preset=tinyllama-1.1b
if step_begin e2e 40 1; then
    lattice="$(exe lattice)"
    if [[ -z "$lattice" ]]; then
        step_end FAIL "${no_bundle:-the lattice executable was not built}"
    else
        notes=(); worst=PASS
        for batch in 1 8; do
            per_ms=$(( allowed_ms - ($(now_ms) - step_t0) ))
            (( batch == 1 )) && per_ms=$(( per_ms / 2 ))
            (( per_ms >= $(ms 5) )) || { notes+=("b$batch: out of time"); worst=TIMEOUT; break; }
            echo "=== e2e batch $batch" >>"$out/bench.log"
            run_logged "$out/bench.log" "$(sec "$per_ms")" "$lattice" generate --random-weights --config "$e2e_preset" \
                --quant w8a8 --device cuda --prompt-ids 1,2,3,4,5,6,7,8 --max-new-tokens 64 --ignore-eos \
                --batch "$batch" --stats-json "$work/e2e_b$batch.json"
            rc=$?
            if [[ $rc -eq 0 && -f "$work/e2e_b$batch.json" ]]; then
                notes+=("b$batch $(report note e2e "$work/e2e_b$batch.json")")
            elif (( have_gpu == 0 )); then
                notes=("no GPU: lattice said: $(grep -m1 'error' "$out/bench.log" | sed 's/^lattice: error: //' | cut -c1-90)")
                worst=SKIP; [[ $rc -eq 0 ]] && worst=FAIL
                break
            else
                notes+=("b$batch exit $rc: $(tail -1 "$out/bench.log" | cut -c1-80)")
                worst="$(status_of $rc)"
            fi
        done
        python3 - "$work" "$e2e_preset" <<'EOF' 2>/dev/null
import glob, json, os, sys
runs = {os.path.basename(p)[5:-5]: json.load(open(p)) for p in sorted(glob.glob(os.path.join(sys.argv[1], "e2e_b*.json")))}
json.dump({"preset": sys.argv[2], "quant": "w8a8", "device": "cuda", "runs": runs},
          open(os.path.join(sys.argv[1], "e2e.json"), "w"), indent=2)
EOF
        tail -6 "$out/bench.log"
        step_end "$worst" "$e2e_preset w8a8: ${notes[*]}"
    fi
fi
