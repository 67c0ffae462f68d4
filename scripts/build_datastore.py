"""Build the retrieval datastore of the offline default target: its own greedy answers to prompts
made up here from templates (never the benchmark's prompts), stored as token ids.

The lookup drafter searches it when the prompt and the output so far have no good n-gram match:
a small model's answers reuse the same phrases ("Here are some tips", "**Step 1:", "In conclusion,")
whatever the question, so the target's own past answers predict its next tokens (the idea of REST,
He et al. 2023, with the model's outputs as the corpus).

    python scripts/build_datastore.py --prompts 400 --max-new-tokens 160 --out assets/datastore-smollm2-135m.npz

Seeded and greedy, so a rerun rebuilds the same file on the same software.
"""

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.drafters.datastore import save_datastore  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "machine learning",
    "climate change", "the human immune system", "volcanoes", "the stock market", "renewable energy",
    "the Roman Empire", "DNA replication", "social media", "electric cars", "the printing press",
    "honeybees", "inflation", "the Cold War", "quantum computing", "the Great Barrier Reef",
    "sleep", "coffee", "the Olympic Games", "plate tectonics", "vaccines", "the internet",
    "ancient Egypt", "recycling", "artificial intelligence", "the moon landing", "jazz music",
    "the Industrial Revolution", "gravity", "rainforests", "cryptocurrency", "meditation",
    "the Renaissance", "earthquakes", "public libraries", "space exploration", "chess",
    "the Silk Road", "antibiotics", "urban gardening", "solar panels", "the Amazon river",
    "democracy", "the theory of evolution", "video games", "healthy eating",
    "the causes of World War I", "friendship", "the meaning of happiness", "minimalism",
    "the history of the bicycle", "ocean tides", "the periodic table", "Newton's laws of motion",
    "supply and demand", "the role of museums", "remote work", "electric guitars", "Shakespeare",
    "the Moon's phases", "magnetism", "entropy", "the speed of light", "cell division",
    "free will", "the ethics of genetic engineering", "the Great Depression", "tea ceremonies",
]
QUESTIONS = ["What makes a good leader?", "Why do people procrastinate?", "Is it better to rent or buy a home?",
             "How does memory work?", "What would happen if the Moon disappeared?",
             "Why is the sky blue?", "How do airplanes stay in the air?", "What is the best way to learn math?",
             "If a train leaves at 3 pm and travels 120 km at 60 km per hour, when does it arrive?",
             "A farmer has 17 sheep and all but 9 run away. How many are left?",
             "Which is heavier, a kilogram of feathers or a kilogram of iron?"]
PEOPLE = ["your manager", "a new client", "your landlord", "a university professor", "your team",
          "a customer who complained", "a hiring manager", "your neighbour", "a school principal"]
ROLES = ["travel guide", "pirate captain", "medieval knight", "detective", "chef", "astronaut",
         "personal trainer", "history teacher", "software engineer", "museum curator"]
ACTIVITIES = ["learning a new language", "running a marathon", "saving money", "public speaking",
              "working from home", "studying for exams", "starting a small business", "cooking at home",
              "writing a novel", "taking better photos", "staying focused", "planning a trip"]
CODE = ["reverses a string", "checks whether a number is prime", "counts the words in a text",
        "returns the largest element of a list", "merges two sorted lists",
        "computes the factorial of n", "removes duplicates from a list",
        "converts Celsius to Fahrenheit", "finds the second smallest number in a list",
        "checks whether a string is a palindrome", "sums the digits of an integer",
        "returns the n-th Fibonacci number iteratively"]
LANGS = ["Python", "JavaScript", "C++", "Java"]
NAMES = ["Maria", "Tom", "Aisha", "Kenji", "Lucas", "Priya", "Omar", "Elena", "Sam", "Grace"]
ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "stamps", "coins"]
SENTENCES_DE = [
    "Das Wetter ist heute sehr schön , und wir gehen in den Park .",
    "Die Regierung hat neue Regeln für den Verkehr in der Stadt beschlossen .",
    "Mein Bruder arbeitet seit drei Jahren in einem kleinen Restaurant .",
    "Der Zug nach Berlin hat leider eine Stunde Verspätung .",
    "Viele Menschen lesen am Abend gern ein gutes Buch .",
    "Das Museum ist am Montag geschlossen .",
    "Wir haben im Sommer eine lange Reise durch Italien gemacht .",
    "Die Kinder spielen im Garten mit dem Hund .",
]


def make_prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    t = lambda: rng.choice(TOPICS)  # noqa: E731
    makers = [
        lambda: f"Explain {t()} in simple terms.",
        lambda: f"Write a short story about {t()}.",
        lambda: f"Write a poem about {t()}.",
        lambda: f"Write a professional email to {rng.choice(PEOPLE)} about {t()}.",
        lambda: f"Give me five tips for {rng.choice(ACTIVITIES)}.",
        lambda: f"What are the pros and cons of {t()}?",
        lambda: f"Compare {t()} and {t()}.",
        lambda: f"Summarize the most important facts about {t()} in one paragraph.",
        lambda: f"What is {t()}, and why does it matter?",
        lambda: f"Pretend you are a {rng.choice(ROLES)}. Tell me about {t()}.",
        lambda: f"Write a {rng.choice(LANGS)} function that {rng.choice(CODE)}.",
        lambda: f"Translate German to English: {rng.choice(SENTENCES_DE)}",
        lambda: (f"{rng.choice(NAMES)} has {rng.randint(5, 60)} {rng.choice(ITEMS)}. "
                 f"She buys {rng.randint(2, 30)} more and gives {rng.randint(1, 5)} to each of her "
                 f"{rng.randint(2, 4)} friends. How many does she have left? Solve it step by step."),
        lambda: (f"A shop sells {rng.choice(ITEMS)} for ${rng.randint(2, 9)} each. How much do "
                 f"{rng.randint(3, 25)} of them cost with a {rng.choice([10, 15, 20, 25])}% discount?"),
        lambda: f"Write an essay outline on {t()}.",
        lambda: f"What questions should I ask before {rng.choice(ACTIVITIES)}?",
        lambda: rng.choice(QUESTIONS),
        lambda: f"Write a persuasive blog post about {t()}.",
        lambda: f"Describe the main causes and effects of {t()}.",
        lambda: f"How would you teach {t()} to a ten-year-old?",
        lambda: f"Write a product description for a gadget inspired by {t()}.",
        lambda: f"Write a dialogue between two friends arguing about {t()}.",
        lambda: f"What are the three most common misconceptions about {t()}?",
        lambda: f"As a {rng.choice(ROLES)}, answer this: {rng.choice(QUESTIONS)}",
        lambda: f"Fix the bug in this {rng.choice(LANGS)} code that {rng.choice(CODE)}, and explain it.",
        lambda: f"Create a lesson plan on {t()} for high school students.",
    ]
    seen, out = set(), []
    while len(out) < n:
        p = rng.choice(makers)()
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="assets/datastore-smollm2-135m.npz")
    ap.add_argument("--pair", default="smollm2-135m-lookup")
    args = ap.parse_args()
    # plain lookup: the pair's own drafter reads the very file being built (and need not exist yet)
    pipe = build_pipeline(load_registry(), pair=args.pair, drafter="lookup", device="cpu")
    pipe.warm_up()
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=args.max_new_tokens)
    seqs, t0 = [], time.time()
    prompts = make_prompts(args.prompts, args.seed)
    for i, prompt in enumerate(prompts):
        ids = pipe.encode(prompt)
        out = list(pipe.speculative(ids, cfg))[-1].output_ids
        seqs.append(ids[-8:] + out)  # the end of the chat template leads into the answer
        if (i + 1) % 20 == 0:
            print(f"{i + 1}/{len(prompts)} prompts, {sum(map(len, seqs))} tokens, "
                  f"{time.time() - t0:.0f} s", file=sys.stderr)
    save_datastore(args.out, seqs, model=pipe.target.name, vocab_size=len(pipe.tokenizer),
                   prompts=len(prompts), seed=args.seed, max_new_tokens=args.max_new_tokens)
    size = Path(args.out).stat().st_size
    print(f"{args.out}: {len(seqs)} answers, {sum(map(len, seqs))} tokens, {size / 1e6:.2f} MB")


if __name__ == "__main__":
    np.set_printoptions(linewidth=120)
    main()
