#!/usr/bin/env bash
# Install what is needed and run the whole test suite (tiny models, then the real default model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -rs -p no:cacheprovider "$@"     # -rs: every skip prints its reason
