#!/usr/bin/env bash
# The GPU checks, as one script for a lent machine (the device tool): the pipeline on CUDA with a
# local random pair (scripts/make_gpu_pair.py .gpu, run here first: the app's path, every offline
# drafter kind, bfloat16), then scripts/gpu_check.py at SmolLM2-1.7B's shapes in bfloat16 and float32.
# Measured 2026-12-04 on an H200 with this project's transformers (5.24.0) carried as a wheel and
# installed first (pip install --no-deps --target /tmp/site; PYTHONPATH=/tmp/site): the machine's
# image had 5.17.0. Results go to $OUT (or /tmp/gpu-out). Each stage has its own time limit, so a slow one leaves the
# others' results.
set -o pipefail
O=${OUT:-/tmp/gpu-out}; mkdir -p "$O"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee "$O/machine"
PROMPT="Write a list of fruits and what each one is good for."
{
  for p in gpu-tiny-head gpu-tiny-recycling gpu-tiny-early-exit; do
    echo "== $p greedy"; timeout 90 python3 -m specviz run --models .gpu/models.yaml --pair "$p" --device cuda \
      --prompt "$PROMPT" --max-new-tokens 48 2>&1 | tail -2
  done
  echo "== gpu-tiny-head sampled"; timeout 90 python3 -m specviz run --models .gpu/models.yaml --pair gpu-tiny-head \
    --device cuda --prompt "$PROMPT" --max-new-tokens 48 --temperature 0.7 --seed 3 2>&1 | tail -1
  echo "== gpu-tiny-self-bf16 float32"; timeout 90 python3 -m specviz run --models .gpu/models.yaml \
    --pair gpu-tiny-self-bf16 --device cuda --dtype float32 --prompt "$PROMPT" --max-new-tokens 48 2>&1 | tail -1
  echo "== bench"; timeout 120 python3 -m specviz bench --models .gpu/models.yaml --pair gpu-tiny-head --device cuda \
    --prompts .gpu/prompts.jsonl --max-new-tokens 32 --repeats 2 2>&1 | grep -E "^\| (overall|category)"
} 2>&1 | tee "$O/pipeline.log"
timeout 200 python3 scripts/gpu_check.py --targets 1.7b --drafters self,lookup,recycling,head \
  --json "$O/bf16.json" 2>&1 | tee "$O/bf16.log" | grep -E "^(\||built|NVIDIA)"
timeout 200 python3 scripts/gpu_check.py --targets 1.7b --dtype float32 --drafters lookup,recycling,head,self_bf16 \
  --json "$O/fp32.json" 2>&1 | tee "$O/fp32.log" | grep -E "^(\||built|NVIDIA)"
