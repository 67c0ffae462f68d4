"""Train the draft head of the offline default target (specviz/drafters/head.py) on this CPU.

Three stages, each cached in --work so a rerun picks up where it stopped:
  1. answers: the target's greedy answers (batched, left-padded) to prompts the benchmark never
     uses: build_datastore's template prompts (seeds 0, 1 and 2) and, with --prompts, the prompts of a
     Spec-Bench style file from the --skip + 1-th of each category on (the bench takes the first 3
     and the held-out check the next 3: --skip 6 leaves both out);
  2. states: one teacher-forced pass per answer keeps the target's final-norm output at every
     position (what its LM head reads);
  3. training: from the state h_t and the token x_{t+1}, predict the target's next state and its
     next token x_{t+2} (its greedy choice), then go on from the head's own predicted state for
     --unroll steps, as drafting does (trained on its own outputs, so later steps see what they
     will see). Loss: cross-entropy on the head's vocabulary (the --vocab most frequent tokens of
     the answers) plus a smooth-L1 pull toward the true next state. Held-out answers (10%) give
     the chain accuracy per step and the keep-chance priors per band of the head's top probability.
     The head memorises: with ~1,650 answers it was right about the first token of 92% of its
     training chains and 58.5% of held-out ones, with 3,594 67%, with 7,227 73%: the number of
     answers is what moves it. Each epoch's head is written to --out as it ends.

    python scripts/train_draft_head.py --prompts ../shared/prompts/specbench-dev.jsonl --skip 6 \
        --extra-seeds 3 --epochs 3

The shipped head (7,227 answers): ~3 h 40 min on a 2-core CPU (answers ~2 h, states ~60 min,
training ~35 min with its products in bfloat16); without --extra-seeds (~3,600 answers) about half.
Seeded; the bf16 products make the weights depend on the CPU's kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# batched generation pads prompts on the left: torch's attention with a mask, not the exact mode's
os.environ.setdefault("SPECVIZ_EXACT", "0")

from build_datastore import make_prompts  # noqa: E402

from specviz.backends.transformers import load_model, model_eos_ids  # noqa: E402
from specviz.bench import load_prompts  # noqa: E402
from specviz.drafters.head import DraftHead, chains, fit, priors, save_head, unrolled  # noqa: E402
from specviz.engine import encode_prompt  # noqa: E402
from specviz.registry import load_registry  # noqa: E402


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


@torch.inference_mode()
def answers(model, tok, prompts: list[str], max_new: int, batch: int, out: Path,
            max_prompt: int) -> list[tuple[list, list]]:
    done: list = torch.load(out) if out.exists() else []
    eos = set(model_eos_ids(model)) | {tok.eos_token_id}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    wanted = {tuple(encode_prompt(tok, p)) for p in prompts}
    todo = sorted((x for x in wanted - {tuple(x) for x, _ in done} if len(x) <= max_prompt), key=len)
    t0 = time.time()
    for b in range(0, len(todo), batch):
        chunk = [list(x) for x in todo[b:b + batch]]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in chunk])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in chunk])
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             pad_token_id=pad)
        for x, row in zip(chunk, gen[:, width:].tolist()):
            ans = []
            for t in row:
                ans.append(t)
                if t in eos:
                    break
            done.append((x, ans))
        torch.save(done, out)
        log(f"answers: {len(done)} ({sum(len(a) for _, a in done)} tokens), {time.time() - t0:.0f} s")
    return done


@torch.inference_mode()
def states(model, pairs, out: Path) -> tuple[list, list]:
    hs, xs = [], []
    if out.exists():  # states of the first answers, from an earlier run: compute only the rest
        d = torch.load(out)
        hs, xs = d["H"], d["X"]
        if len(xs) > len(pairs) or any(x.tolist() != (list(p) + list(a))[len(p) - 2:]
                                       for x, (p, a) in zip(xs, pairs)):
            log("states: the cached states are not those of these answers; computing them all")
            hs, xs = [], []
        elif len(hs) == len(pairs):
            return hs, xs
    cap = {}
    norm = model.get_decoder().norm
    hook = norm.register_forward_hook(lambda m, i, o: cap.__setitem__("h", o.detach()))
    t0 = time.time()
    for n, (prompt, ans) in enumerate(pairs[len(hs):], len(hs)):
        full = list(prompt) + list(ans)
        model(input_ids=torch.tensor([full]), logits_to_keep=1)
        a = len(prompt) - 2  # the state that predicted the last prompt token: drafting's first start
        hs.append(cap["h"][0, a:].to(torch.float16).clone())
        xs.append(torch.tensor(full[a:]))
        if n % 200 == 0:
            log(f"states: {n}/{len(pairs)}, {time.time() - t0:.0f} s")
        if n % 1000 == 999:  # a stopped run resumes from here
            torch.save({"H": hs, "X": xs}, out)
    hook.remove()
    torch.save({"H": hs, "X": xs}, out)
    return hs, xs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="smollm2-135m-lookup", help="its target is the model the head serves")
    ap.add_argument("--prompts", help="a Spec-Bench style .jsonl whose later prompts add to the templates")
    ap.add_argument("--skip", type=int, default=6, help="leave out the first N prompts of each category")
    ap.add_argument("--templates", type=int, default=1300, help="template prompts of seed 1 (beside 500 of seed 0)")
    ap.add_argument("--more-templates", type=int, default=3000,
                    help="template prompts of seed 2 (many repeat earlier ones; 3000 add ~1,900 new)")
    ap.add_argument("--extra-seeds", type=int, default=0,
                    help="add 3000 template prompts of each of seeds 3, 4, ... (3 seeds: ~3,600 new ones, about "
                         "twice the answers of the shipped head; the answers stage alone then takes ~90 min)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=800,
                    help="leave out longer prompts (a batch of long contexts is slow to generate on a CPU)")
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--vocab", type=int, default=6144)
    ap.add_argument("--ff", type=int, default=1536)
    ap.add_argument("--unroll", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                    help="bf16: the training products in bfloat16 (CPU autocast; 1.65x faster here, same accuracy on a check)")
    ap.add_argument("--work", default="/tmp/specviz-head")
    ap.add_argument("--out", default="assets/draft-head-smollm2-135m.safetensors")
    args = ap.parse_args()
    torch.manual_seed(0)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    reg = load_registry()
    target = reg.pairs[args.pair].target
    lm = load_model(reg.model(target), device="cpu")
    model, tok = lm.model, lm.tokenizer
    spare = [r["prompt"] for r in load_prompts(args.prompts, skip=args.skip)] if args.prompts else []
    prompts = spare + make_prompts(500, 0) + make_prompts(args.templates, 1) + make_prompts(args.more_templates, 2)
    for seed in range(3, 3 + args.extra_seeds):
        prompts += make_prompts(3000, seed)
    pairs = answers(model, tok, list(dict.fromkeys(prompts)), args.max_new_tokens, args.batch, work / "answers.pt",
                    args.max_prompt_tokens)
    hs, xs = states(model, pairs, work / "states.pt")

    emb = model.get_input_embeddings().weight.detach().float()
    out_w = model.get_output_embeddings().weight.detach().float()
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(hs), generator=g).tolist()
    n_test = max(1, len(hs) // 10)
    test, train = order[:n_test], order[n_test:]
    counts = torch.bincount(torch.cat([xs[i][1:] for i in train]), minlength=emb.shape[0])
    vocab = torch.argsort(counts, descending=True)[: args.vocab]
    vocab = vocab[counts[vocab] > 0]
    coverage = counts[vocab].sum().item() / counts.sum().item()
    out_rows = out_w[vocab]
    K = args.unroll
    data = chains([hs[i] for i in train], [xs[i] for i in train], K)
    held = chains([hs[i] for i in test], [xs[i] for i in test], K)
    log(f"{len(pairs)} answers, vocabulary {len(vocab)} (covers {coverage:.4f}), "
        f"{len(data[0])} train / {len(held[0])} held-out chains")
    head = DraftHead(emb.shape[1], args.ff)
    t0 = time.time()
    result = {}

    def evaluate(ep: int) -> None:
        with torch.no_grad():
            _, steps = unrolled(head, emb, out_rows, vocab, *held)
        acc = [float((s[1] & s[2]).float().mean()) for s in steps]
        result.update(steps=steps, acc=acc)
        log(f"epoch {ep + 1}/{args.epochs}, {time.time() - t0:.0f} s: held-out chain accuracy "
            + " ".join(f"{a:.3f}" for a in acc))
        save(ep + 1)  # each epoch's head: a stopped run still leaves the latest one

    def save(done_epochs: int) -> None:
        save_head(args.out, head, vocab, model=target, priors=priors(result["steps"]),
                  held_out_chain_accuracy=[round(a, 4) for a in result["acc"]], answers=len(pairs),
                  train_chains=len(data[0]), vocab_coverage=round(coverage, 5), unroll=K, epochs=done_epochs,
                  precision=args.precision)

    fit(head, emb, out_rows, vocab, data, args.epochs, args.lr, generator=g, each_epoch=evaluate,
        bf16=args.precision == "bf16")
    oks = result["acc"]
    log(f"priors (first, later): {priors(result['steps'])}")
    print(f"{args.out}: {Path(args.out).stat().st_size / 1e6:.2f} MB; held-out chain accuracy "
          + " ".join(f"{a:.3f}" for a in oks))


if __name__ == "__main__":
    main()
