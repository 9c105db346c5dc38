#!/usr/bin/env python3
"""The layer arrows of docs/design.md, enforced: every project include ("dir/file.h") of every
source file must point to a folder its own folder may include. A file that includes a header from a
layer above its own (kernels including runtime, the model including the engine ...) fails the test
with the file, the line and the rule.

    base  <-  kernels/common  <-  kernels/cpu, kernels/cuda  <-  parallel
          <-  runtime: arch  <-  weights, backend, tokenizer  <-  model  <-  engine  <-  builder  <-  launch
                                                        model  <-  converter  <-  launch

runtime/builder (a rank's backend, communicators, model shard, KV cache and engine) sits above the
engine; runtime/converter (`lattice convert`) above the model and the weights. Neither includes the
other, and nothing below them includes either: only launch/, benchmarks and tests do.

Inside launch/ (the fronts):   launch/openai/  <-  launch/server/  <-  launch/ (cmd_*, cli_common ...)
launch/openai/ (the OpenAI protocol that serve and batch share) includes neither launch/server/ (the
HTTP transport, metrics, the engine loop) nor the commands; launch/server/ may include launch/openai/
but not the commands; the commands include both. And launch/ builds no model: runtime/backend/ and
runtime/model/ are the builder's (launch/ asks runtime/builder/), except runtime/model/smoothquant.h,
the calibration API `lattice calibrate` drives.

Rules are prefixes (the longest that matches a file's path wins). runtime/arch (ModelConfig and the
architecture table) sits below runtime/weights: the weight sources parse configs and name tensors
through the table, and the model, the converter and everything above read the same entries.
launch/ is parsing and formatting: none of its files includes an MPI header (<mpi.h>, parallel/mpi_*.h)
or names an MPI identifier (`MPI_...`, comments included); it reaches the ranks through
parallel/world_session.h and parallel/rank_agreement.h.
Usage: check_layers.py [REPO_ROOT]   (exit 0: clean; 1: violations, listed)
       check_layers.py --self-test     (the check itself catches an upward include and a bad path,
                                        also inside launch/)
"""
import os
import re
import sys

# folder (prefix) -> folders (prefixes) its files may include; a folder may always include itself.
BASE = ["base/"]
KERNELS_COMMON = BASE + ["kernels/common/"]
RULES = {
    "base/": [],
    "kernels/common/": BASE,
    "kernels/cpu/": KERNELS_COMMON,
    "kernels/cuda/": KERNELS_COMMON,
    "parallel/": BASE,
    "runtime/arch/": BASE + ["parallel/world_config.h"],
    "runtime/weights/": BASE + ["kernels/common/", "parallel/world_config.h", "runtime/arch/"],
    "runtime/backend/": KERNELS_COMMON + ["kernels/cpu/", "kernels/cuda/", "parallel/"],
    "runtime/tokenizer/": BASE + ["runtime/weights/gguf.h"],
    "runtime/model/": BASE + ["kernels/common/", "parallel/", "runtime/backend/backend.h", "runtime/arch/",
                              "runtime/weights/"],
    "runtime/engine/": BASE + ["kernels/common/", "parallel/", "runtime/backend/", "runtime/arch/", "runtime/weights/",
                               "runtime/model/",
                               "runtime/tokenizer/"],
    "runtime/builder/": BASE + ["parallel/", "runtime/backend/", "runtime/arch/", "runtime/weights/", "runtime/model/",
                                "runtime/tokenizer/", "runtime/engine/"],
    "runtime/converter/": BASE + ["parallel/", "runtime/backend/backend.h", "runtime/arch/", "runtime/weights/", "runtime/model/"],
    # launch/ builds no backend or model itself: it asks runtime/builder/.
    "launch/": BASE + ["kernels/", "parallel/", "runtime/arch/", "runtime/weights/", "runtime/tokenizer/",
                       "runtime/engine/", "runtime/builder/", "runtime/converter/", "runtime/model/smoothquant.h"],
    "launch/openai/": BASE + ["runtime/engine/", "runtime/tokenizer/"],
    "launch/server/": BASE + ["launch/openai/", "runtime/engine/", "runtime/tokenizer/"],
    # benchmarks and tests sit beside the tree and may use any layer (but not each other's files).
    "benchmarks/": BASE + ["kernels/", "parallel/", "runtime/", "launch/"],
    "tests/": BASE + ["kernels/", "parallel/", "runtime/", "launch/"],
}
SOURCE_DIRS = ["base", "kernels", "parallel", "runtime", "launch", "benchmarks", "tests"]
EXTS = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# launch/ stays above MPI: no MPI header, no MPI identifier (MPI_Init, MPI_COMM_WORLD ...).
MPI_INCLUDE = re.compile(r'^\s*#\s*include\s+[<"](mpi\.h|parallel/mpi_[^">]*)[">]')
MPI_IDENTIFIER = re.compile(r'\bMPI_[A-Za-z_]\w*')
# ... and drives no engine: requests go through the engine client (runtime/engine/client.h), never
# Engine::step / add / follow / generate_batch on an engine directly.
ENGINE_CALL = re.compile(r'\bengine\w*\s*(\.|->)\s*(step|add|follow|generate_batch|generate|cancel|shutdown|score)\s*\(')


def rule_for(path):
    best = None
    for prefix in RULES:
        if path.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return best


def allowed(path, target):
    prefix = rule_for(path)
    own = prefix if prefix.endswith("/") else os.path.dirname(prefix) + "/"
    if target.startswith(own):
        return True
    return any(target.startswith(p) for p in RULES[prefix])


def launch_mpi_violations(path, n, line):
    out = []
    if MPI_INCLUDE.match(line):
        out.append(f"{path}:{n}: launch/ includes no MPI header (use parallel/world_session.h)")
    elif MPI_IDENTIFIER.search(line):
        out.append(f"{path}:{n}: launch/ names no MPI identifier ({MPI_IDENTIFIER.search(line).group(0)}): "
                   f"MPI stays in parallel/")
    if ENGINE_CALL.search(line.split("//")[0]):
        out.append(f"{path}:{n}: launch/ drives no engine ({ENGINE_CALL.search(line).group(0)}): use the engine "
                   f"client (runtime/engine/client.h)")
    return out


def main(root):
    bad = []
    checked = 0
    for top in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith(EXTS):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        if path.startswith("launch/"):
                            bad += launch_mpi_violations(path, n, line)
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        checked += 1
                        if "/" not in target or target.startswith("."):
                            bad.append(f"{path}:{n}: \"{target}\": name project headers from the repository root")
                        elif not os.path.exists(os.path.join(root, target)):
                            bad.append(f"{path}:{n}: \"{target}\" does not exist")
                        elif not allowed(path, target):
                            bad.append(f"{path}:{n}: \"{target}\": {rule_for(path)} may include only "
                                       f"{', '.join(RULES[rule_for(path)]) or 'itself'}")
    for b in bad:
        print(b)
    print(f"check_layers: {checked} includes checked, {len(bad)} violations")
    return 1 if bad else 0


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        write("runtime/engine/e.h", "#pragma once\n")
        write("runtime/model/m.h", '#include "runtime/engine/e.h"\n')  # upward
        write("kernels/cpu/k.cpp", '#include "kernels/cpu/missing.h"\n#include "local.h"\n')
        write("launch/ok.cpp", '#include "runtime/engine/e.h"\n#include "runtime/builder/b.h"\nconst char* e = "OMPI_COMM_WORLD_SIZE";  // LATTICE_NO_MPI\n')
        # inside launch/: openai <- server <- the commands; the commands build no model themselves
        write("launch/cli.h", "#pragma once\n")
        write("launch/openai/o.h", '#include "runtime/engine/e.h"\n')
        write("launch/openai/o_up.cpp", '#include "launch/server/s.h"\n#include "launch/cli.h"\n')  # both upward
        write("launch/server/s.h", '#include "launch/openai/o.h"\n')
        write("launch/server/s_up.cpp", '#include "launch/cli.h"\n')  # upward: server -> commands
        write("launch/cmd_x.cpp",
              '#include "launch/server/s.h"\n#include "launch/openai/o.h"\n#include "launch/cli.h"\n')
        write("runtime/model/smoothquant.h", "#pragma once\n")
        write("runtime/backend/be.h", "#pragma once\n")
        write("launch/cmd_build.cpp", '#include "runtime/model/smoothquant.h"\n#include "runtime/model/m.h"\n'
                                      '#include "runtime/backend/be.h"\n')
        write("parallel/mpi_x.h", "#pragma once\n")
        write("launch/mpi_a.cpp", '#include <mpi.h>\n')
        write("launch/mpi_b.cpp", '#include "parallel/mpi_x.h"\n')
        write("launch/mpi_c.cpp", 'void f() { MPI_Finalize(); }\n')
        write("launch/eng.cpp", 'void f(R& lm) { lm.engine->step(); }\nvoid g(EngineClient& c) { c.poll(); }\n')
        write("runtime/builder/b.h", '#include "runtime/engine/e.h"\n')  # the builder sits on the engine
        write("runtime/converter/c.h", '#include "runtime/model/m.h"\n')
        write("runtime/engine/e2.h", '#include "runtime/builder/b.h"\n')  # upward: engine -> builder
        write("runtime/converter/c2.h", '#include "runtime/builder/b.h"\n')  # sideways: converter -> builder
        import io
        import contextlib
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(root)
        text = out.getvalue()
        ok = (rc == 1 and "runtime/model/m.h:1" in text and "missing.h\" does not exist" in text
              and "name project headers from the repository root" in text and "launch/ok.cpp" not in text
              and "launch/mpi_a.cpp:1: launch/ includes no MPI header" in text
              and "launch/mpi_b.cpp:1: launch/ includes no MPI header" in text
              and "launch/mpi_c.cpp:1: launch/ names no MPI identifier (MPI_Finalize)" in text
              and "launch/eng.cpp:1: launch/ drives no engine" in text and "launch/eng.cpp:2" not in text
              and "runtime/engine/e2.h:1" in text and "runtime/converter/c2.h:1" in text
              and "runtime/builder/b.h:1" not in text and "runtime/converter/c.h:1" not in text
              and "launch/openai/o_up.cpp:1" in text and "launch/openai/o_up.cpp:2" in text
              and "launch/server/s_up.cpp:1" in text and "launch/server/s.h:" not in text
              and "launch/openai/o.h:" not in text and "launch/cmd_x.cpp" not in text
              and "launch/cmd_build.cpp:1" not in text and "launch/cmd_build.cpp:2" in text
              and "launch/cmd_build.cpp:3" in text)
        print(text + ("self-test passed" if ok else "self-test FAILED"))
        return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
