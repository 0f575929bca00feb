"""How often the CPU demo's BCQ and NCQ groups can carry a learning signal, with and without
candidate compression, on nothing but this repository.

    .venv/bin/python benchmarks/bench_demo_signal.py [--questions 80] [--rollouts 16] [--caps 24 48]

Student and teacher are the demo's SmolLM2-135M-Instruct (``make demo`` materializes it in
.cache/demo/), both sampled with ``transformers`` generate at the settings of
recipes/demo.yaml (closer, temperatures, answer length, G_S, G_T). For ``--questions`` demo
questions, seeded:

1. The student answers each plain prompt G_S times, the teacher G_T times. A question is hard
   when at most ``hard_threshold`` of its rollouts are right and one wrong rollout parses; BCQ
   also needs a graded-correct teacher answer (one drawn uniformly, as the trainer plans them).
2. For every setting (compressed at each cap in ``--caps``, and uncompressed) the same hard
   questions get a BCQ prompt (the teacher's answer and one wrong student answer, shuffled) and
   an NCQ prompt (every parsed wrong answer), built with zppo_trl's own templates; compression
   is the teacher's reply to ``fig:prompt-compression``, its summary taken as the trainer takes it.
3. The student samples ``--rollouts`` answers per reformulated prompt; consecutive runs of
   G_S are read as groups. Reported per setting: compressions that kept a ``\\boxed{}`` and
   the correct teacher candidates that kept the gold answer, BCQ/NCQ rollouts boxed and right,
   and groups with a learning signal (some rollouts right, some wrong).

The plain rollouts and hard questions are the same for every setting; the rest is sampled.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import yaml  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from zppo_trl.prompts import bcq_block, compose_prompt, ncq_block, render_compression  # noqa: E402
from zppo_trl.rewards import extract_boxed, grade_batch  # noqa: E402
from zppo_trl.teacher import extract_summary  # noqa: E402

BATCH = 32


class Sampler:
    """Chat-formatted sampling from one local model, in batches."""

    def __init__(self, model_dir: str):
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()

    def __call__(self, prompts: list[str], n: int, temperature: float, max_new_tokens: int) -> list[list[str]]:
        chats = [
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in prompts
            for _ in range(n)
        ]
        texts: list[str] = []
        for start in range(0, len(chats), BATCH):
            encoded = self.tokenizer(chats[start : start + BATCH], return_tensors="pt", padding=True)
            with torch.no_grad():
                out = self.model.generate(
                    **encoded,
                    do_sample=True,
                    temperature=temperature,
                    top_p=1.0,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=self.tokenizer.pad_token_id,
                )
            texts += self.tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
        return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]


def hard_questions(rows, plain, teacher, tau: float, rng: random.Random) -> list[dict]:
    """The hard questions: rows with their wrong parsed rollouts and one of the teacher's
    graded-correct answers drawn uniformly (None when it had none), as the trainer plans them."""
    hard = []
    for row, rollouts, answers in zip(rows, plain, teacher):
        right = grade_batch(rollouts, [row["answer"]] * len(rollouts))
        wrong = [r for r, ok in zip(rollouts, right) if not ok and extract_boxed(r) is not None]
        if sum(right) / len(rollouts) <= tau and wrong:
            correct = [a for a, ok in zip(answers, grade_batch(answers, [row["answer"]] * len(answers))) if ok]
            hard.append(dict(row=row, wrong=wrong, teacher=rng.choice(correct) if correct else None))
    return hard


def evaluate(sample, hard, settings: dict, cap: int | None, rollouts: int, rng: random.Random) -> dict:
    """One setting: build every BCQ/NCQ prompt (compressing at ``cap``, or not), sample, count."""
    temperature, length, group = (
        settings["temperature"],
        settings["max_completion_length"],
        settings["num_generations"],
    )
    closer = settings["closer"]

    stats = dict(compressions=0, kept_box=0, teacher_candidates=0, kept_gold=0)

    def compress(texts: list[str]) -> list[str | None]:
        """The candidates as they enter the prompt; compressions are counted here."""
        if cap is None:
            return texts
        replies = sample([render_compression(t) for t in texts], 1, settings["teacher_temperature"], cap)
        summaries = [extract_summary(r[0])[0] for r in replies]
        stats["compressions"] += len(summaries)
        stats["kept_box"] += sum(s is not None and extract_boxed(s) is not None for s in summaries)
        return summaries

    prompts = {"bcq": [], "ncq": []}
    for h in hard:
        question, gold = h["row"]["question"], h["row"]["answer"]
        if h["teacher"] is not None:
            wrong = rng.choice(h["wrong"])
            texts = compress([h["teacher"], wrong])
            if None not in texts:
                stats["teacher_candidates"] += 1
                stats["kept_gold"] += re.search(rf"(?<!\d){re.escape(gold)}(?!\d)", texts[0]) is not None
                candidates = list(texts)
                rng.shuffle(candidates)
                prompts["bcq"].append((compose_prompt(question, bcq_block(candidates), closer), gold))
        texts = compress(h["wrong"])
        kept = [t for t in texts if t is not None]
        if kept:
            answers = [extract_boxed(w) for w in h["wrong"]]
            prompts["ncq"].append((compose_prompt(question, ncq_block(answers, kept), closer), gold))
    for kind, items in prompts.items():
        outs = sample([p for p, _ in items], rollouts, temperature, length) if items else []
        right = boxed = signal = groups = 0
        for (_, gold), texts in zip(items, outs):
            ok = grade_batch(texts, [gold] * len(texts))
            right += sum(ok)
            boxed += sum(extract_boxed(t) is not None for t in texts)
            for g in range(0, len(ok) - group + 1, group):
                groups += 1
                signal += 0 < sum(ok[g : g + group]) < group
        stats[kind] = dict(
            prompts=len(items),
            rollouts=len(items) * rollouts,
            boxed=boxed,
            right=right,
            groups=groups,
            groups_with_signal=signal,
        )
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=80)
    parser.add_argument(
        "--rollouts", type=int, default=16, help="student rollouts per BCQ/NCQ prompt (read as groups of G_S)"
    )
    parser.add_argument(
        "--caps", type=int, nargs="*", default=[24], help="compression caps to measure (besides uncompressed)"
    )
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "demo.yaml"))
    parser.add_argument("--seed", type=int, default=0)
    cli = parser.parse_args()

    recipe = yaml.safe_load(Path(cli.recipe).read_text())
    model_dir = REPO / recipe["model_name_or_path"]
    if not model_dir.is_dir():
        sys.exit(
            f"error: no model at {model_dir}: run `make demo-env` and "
            f"`.venv/bin/python recipes/demo/prepare_model.py {recipe['model_name_or_path']}`"
        )
    rows = [json.loads(line) for line in (REPO / recipe["dataset_name"]).read_text().splitlines()]
    rng = random.Random(cli.seed)
    rng.shuffle(rows)
    rows = rows[: cli.questions]
    torch.manual_seed(cli.seed)
    sample = Sampler(str(model_dir))

    start = time.perf_counter()
    plain_prompts = [compose_prompt(r["question"], None, recipe["closer"]) for r in rows]
    plain = sample(plain_prompts, recipe["num_generations"], recipe["temperature"], recipe["max_completion_length"])
    teacher = sample(
        plain_prompts, recipe["teacher_num_generations"], recipe["teacher_temperature"], recipe["teacher_max_tokens"]
    )
    plain_right = sum(sum(grade_batch(outs, [r["answer"]] * len(outs))) for r, outs in zip(rows, plain))
    hard = hard_questions(rows, plain, teacher, recipe["hard_threshold"], random.Random(cli.seed))
    print(
        f"{len(rows)} questions: student right on {plain_right}/{len(rows) * recipe['num_generations']} "
        "plain rollouts; "
        f"{len(hard)} hard, {sum(h['teacher'] is not None for h in hard)} with a correct teacher answer "
        f"(G_T={recipe['teacher_num_generations']} at {recipe['teacher_temperature']})"
    )
    for cap in [*cli.caps, None]:
        stats = evaluate(sample, hard, recipe, cap, cli.rollouts, random.Random(cli.seed))
        name = f"compressed at {cap} tokens" if cap else "uncompressed"
        line = f"{name}:"
        if cap:
            line += (
                f" compressions with a box {stats['kept_box']}/{stats['compressions']}; "
                f"teacher candidates keeping the gold answer {stats['kept_gold']}/{stats['teacher_candidates']};"
            )
        for kind in ("bcq", "ncq"):
            k = stats[kind]
            if k["rollouts"]:
                line += (
                    f" {kind.upper()} boxed {k['boxed']}/{k['rollouts']}, right {k['right']}/{k['rollouts']}"
                    f" ({k['right'] / k['rollouts']:.1%}),"
                    f" groups of {recipe['num_generations']} with a signal {k['groups_with_signal']}/{k['groups']};"
                )
        print(line.rstrip(";"))
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
