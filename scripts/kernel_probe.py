"""Time one forward pass of 1, 2, 4, 8 and 11 tokens after 200 tokens of context, on the MKL-packed
kernels and on the exact kernels, same weights, alternated (README: Kernels).

    SPECVIZ_EXACT=0 python scripts/kernel_probe.py
"""
import argparse
import copy
import statistics as st
import sys
import time
from pathlib import Path

import torch

argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                        epilog="Run as SPECVIZ_EXACT=0 python scripts/kernel_probe.py (no options).").parse_args()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specviz.registry import load_registry
from specviz.pipeline import build_pipeline
from specviz.backends import exact
from specviz.backends.transformers import CachedLM
torch.set_num_threads(1)
pipe=build_pipeline(load_registry(), pair="smollm2-135m-lookup", device="cpu", dtype="float32")
m=pipe.target.model; assert pipe.target.kernels=="mkl-packed"
cfg=copy.deepcopy(m.config); cfg._attn_implementation="sdpa"
twin=type(m)(cfg); twin.load_state_dict(m.state_dict()); twin.eval(); exact.enable(twin)
seq=pipe.encode("The quick brown fox jumps over the lazy dog. " * 30, chat=False)
def prof(lm, ctx=200, rounds=9):
    lm.reset(); lm.feed(seq[:ctx], keep_logits=1); out={}
    for r in range(rounds):
        for n in (1,2,4,8,11):
            t=time.perf_counter(); lm.feed(seq[ctx:ctx+n]); out.setdefault(n,[]).append((time.perf_counter()-t)*1e3); lm.rollback(ctx)
    return out
A=CachedLM(m); B=CachedLM(twin)
res={"mkl":{}, "exact":{}}
for rep in range(3):  # alternate the two, 3 x 9 rounds each
    for k,lm in (("mkl",A),("exact",B)):
        for n,v in prof(lm).items(): res[k].setdefault(n,[]).extend(v)
for k,d in res.items():
    print(k, "  ".join(f"{n}: {st.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" for n,v in d.items()))
