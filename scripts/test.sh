#!/usr/bin/env bash
# Install what is needed and run the test suite.
#   bash scripts/test.sh          everything (what CI runs): tiny models, then the real models
#   bash scripts/test.sh --fast   the inner-loop tier: tiny models only, no subprocess but one smoke test
# Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
tier=()
if [[ "${1:-}" == "--fast" ]]; then
    shift
    tier=(-m "not slow")
    export SPECSERVE_FAST_TIER=1       # tests/conftest.py: a real model or a subprocess here is an error
fi
# -rs: every skip prints its reason; --durations=25: where the time went
exec .venv/bin/python -m pytest -q -rs -p no:cacheprovider --durations=25 "${tier[@]}" "$@"
