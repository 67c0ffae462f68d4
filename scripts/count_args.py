"""The flags the counting scripts share (sibling_stats, resync_stats, peer_units): which prompts, how
long an answer, and the pinned cost profile that makes their counts free of timing noise."""

from __future__ import annotations

import argparse


def counting_parser(doc: str, limit: int = 3) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--prompts", required=True, help="a Spec-Bench style .jsonl")
    ap.add_argument("--limit", type=int, default=limit, help="prompts per category")
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N of each category")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--costs", required=True, help="the cost profile v(g) as a JSON list (or 'reference', a saved run)")
    return ap
