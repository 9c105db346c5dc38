# The configure and build steps of benchmarks/gpu/check.sh (sourced, `check.sh all` only, and only when
# no bundle was taken): Release, this GPU's architecture, headers from gpu-kit/include (fmt header-only),
# NCCL's header beside its library in the wheel (the kit's only when the wheel has none), golden data
# from gpu-kit/shared; then the CUDA test executables (read from CTestTestfile.cmake), the GPU
# benchmarks and `lattice` (ninja -k 0: everything that can build does). Sets tests_listing.
configured=0
if step_begin configure 30 0; then
    args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLATTICE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
          -DLATTICE_SHARED_DIR="$shared")
    command -v ninja >/dev/null && args+=(-G Ninja)
    [[ -d "$kit/include" ]] && args+=(-DLATTICE_THIRD_PARTY="$kit")
    [[ -d "$kit/nccl/include" && ! -f "$nccl_root/include/nccl.h" ]] && args+=(-DLATTICE_NCCL_INCLUDE_DIR="$kit/nccl/include")
    [[ -n "$nccl_root" ]] && args+=(-DLATTICE_NCCL_ROOT="$nccl_root")
    [[ "${CHECK_NCCL:-auto}" == off ]] && args+=(-DLATTICE_NCCL=OFF)
    command -v nvcc >/dev/null && args+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
    echo "+ cmake ${args[*]}" >>"$out/build.log"
    timeout -k 2 "$allowed" cmake "${args[@]}" >>"$out/build.log" 2>&1  # its own process group: all of it stops
    rc=$?
    facts="$(sed -n 's/^-- lattice: //p' "$out/build.log" | sed -nE 's/^(MPI|CUDA backend|NCCL) (ON|OFF).*/\1 \2/p; s/^(fmt header-only).*/\1/p' | paste -sd ';' - | sed 's/;/; /g')"
    if [[ $rc -eq 0 ]]; then
        configured=1
        step_end PASS "$facts"
    else
        tail -30 "$out/build.log"
        step_end "$(status_of $rc)" "cmake exited $rc (build.log)"
    fi
fi
if step_begin build 140 0; then
    if [[ $configured -eq 0 ]]; then
        step_end SKIP "configure did not pass"
    else
        mapfile -t cuda_tests < <(python3 "$here/bundle.py" targets "$build")
        targets=("${cuda_tests[@]}" bench_gpu_gemm bench_gpu_attention bench_gpu_decode lattice)
        keep_going=()
        [[ -f "$build/build.ninja" ]] && keep_going=(-- -k 0)
        echo "targets: ${targets[*]}" | tee -a "$out/build.log"
        echo "+ cmake --build $build -j $jobs --target ${targets[*]}" >>"$out/build.log"
        timeout -k 2 "$allowed" cmake --build "$build" -j "$jobs" --target "${targets[@]}" "${keep_going[@]}" \
            >>"$out/build.log" 2>&1
        rc=$?
        missing=()
        for t in "${targets[@]}"; do [[ -n "$(exe "$t")" ]] || missing+=("$t"); done
        if [[ $rc -eq 0 ]]; then
            step_end PASS "${#targets[@]} targets for sm_$arch with $jobs jobs (${#cuda_tests[@]} CUDA test binaries)"
        else
            grep -E 'error|FAILED' "$out/build.log" | head -20
            step_end "$(status_of $rc)" "exit $rc; not built: ${missing[*]:-none} (build.log)"
        fi
    fi
fi
if [[ $configured -eq 1 ]]; then
    tests_listing="$work/ctest-cuda.json"
    (cd "$build" && ctest -N -L cuda --show-only=json-v1 >"$tests_listing" 2>/dev/null) || tests_listing=""
fi
