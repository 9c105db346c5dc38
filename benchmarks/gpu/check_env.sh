# The env step of benchmarks/gpu/check.sh (sourced; uses its step_begin / step_end / report / write_meta).
# Sets: gpu_name gpu_cap have_gpu arch env_line sanitizer shared nccl_root, exports LATTICE_SHARED_DIR,
# LATTICE_SOURCE_DIR and an LD_LIBRARY_PATH that lets carried binaries find the wheel's NCCL and the
# toolkit's cuBLASLt (their RPATH is the build machine's). Writes gpu.txt (nvidia-smi --query-gpu and
# -q before the stage's GPU work), device.json and nccl.json. Takes a second or two; nvidia-smi and
# Python calls are each bounded by `timeout`.
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$PATH:$cuda_home/bin"
step_begin env 10 0
q_fields=name,compute_cap,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,power.limit,power.max_limit,mig.mode.current,ecc.mode.current,memory.total,pstate,temperature.gpu
driver=""
if command -v nvidia-smi >/dev/null 2>&1 &&
    q="$(timeout --foreground 5 nvidia-smi --query-gpu=$q_fields --format=csv,noheader 2>/dev/null | head -1)" && [[ -n "$q" ]]; then
    gpu_name="$(cut -d, -f1 <<<"$q" | xargs)"
    gpu_cap="$(cut -d, -f2 <<<"$q" | tr -d ' .')"
    driver="$(cut -d, -f3 <<<"$q" | xargs)"
    [[ "$gpu_cap" =~ ^[0-9]+$ ]] && have_gpu=1 || gpu_cap=0
    { echo "# nvidia-smi --query-gpu=$q_fields"; echo "$q"; echo; echo "# nvidia-smi -q before stage $stage"
      timeout --foreground 5 nvidia-smi -q 2>&1; } >"$out/gpu.txt"
fi
smi=""
(( have_gpu )) && smi="$(timeout --foreground 10 python3 "$here/check_report.py" device "$work/device.json" "$q_fields" "$q" 2>/dev/null)"
arch="${CHECK_CUDA_ARCH:-90}"
(( have_gpu )) && arch="$gpu_cap"
nvcc_v="$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
cmake_v="$(cmake --version 2>/dev/null | head -1 | awk '{print $3}')"
nccl_root="${LATTICE_NCCL_ROOT:-}"
if [[ -z "$nccl_root" && "${CHECK_NCCL:-auto}" != off ]]; then
    nccl_root="$(timeout --foreground 10 python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
fi
[[ -n "$nccl_root" && -e "$nccl_root/lib/libnccl.so.2" ]] || nccl_root=""
nccl_note="$(timeout --foreground 10 python3 "$here/check_report.py" nccl "$work/nccl.json" "$nccl_root" "$kit/nccl/include/nccl.h" 2>/dev/null)"
shared="$root/../shared"
[[ -d "$shared/golden" ]] || shared="$kit/shared"
export LATTICE_SHARED_DIR="$shared" LATTICE_SOURCE_DIR="$root"
# PyTorch's cuBLAS and CUDA runtime wheels come after the toolkit, for a toolkit without them.
wheel_libs="$(timeout --foreground 10 python3 -c '
import importlib, os
for m in ("nvidia.cublas", "nvidia.cuda_runtime"):
    try:
        print(os.path.join(list(importlib.import_module(m).__path__)[0], "lib"))
    except Exception:
        pass' 2>/dev/null | paste -sd: -)"
export LD_LIBRARY_PATH="${nccl_root:+$nccl_root/lib:}$cuda_home/lib64:$cuda_home/lib${wheel_libs:+:$wheel_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sanitizer="$(command -v compute-sanitizer || true)"
[[ -z "$sanitizer" && -x "$cuda_home/compute-sanitizer/compute-sanitizer" ]] && sanitizer="$cuda_home/compute-sanitizer/compute-sanitizer"
env_line="$(nproc) cores, nvcc ${nvcc_v:-none}, cmake ${cmake_v:-none}, python3 $(python3 -c 'import platform; print(platform.python_version())' 2>/dev/null || echo none), ${nccl_note:-NCCL ?}, compute-sanitizer $([[ -n $sanitizer ]] && echo yes || echo no)"
{ echo "GPU: ${gpu_name:-none} ${driver:+driver $driver} sm_$arch"; echo "$env_line"; echo "kit: $kit"
  echo "golden: $shared/golden"; echo "NCCL wheel: ${nccl_root:-none}"; echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
  echo "compute-sanitizer: ${sanitizer:-none}"
  [[ -n "${LATTICE_TEST_INJECT:-}" ]] && echo "LATTICE_TEST_INJECT=$LATTICE_TEST_INJECT (injected faults)"; } |
    tee -a "$work/env.txt"
write_meta
if [[ -z "$nvcc_v" && "$stage" == all ]]; then
    step_end FAIL "no nvcc on PATH (CUDA_HOME?): cannot build"
else
    step_end PASS "${gpu_name:-no GPU (nvidia-smi absent or silent)}${smi:+ ($smi)}, sm_$arch, ${jobs} cores"
fi
