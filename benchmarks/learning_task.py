"""The learning benchmark's task and models (benchmarks/bench_learning.py): two-digit addition, worked in the
paper's answer format, by a tiny student that forgets to carry and a tiny teacher that does not.

The task. Every question is ``What is a + b?`` for a, b in 10..99 (8,100 questions). A solution works the
columns inside the think block and boxes the sum::

    <think> 7 + 8 = 15 . 4 + 3 + 1 = 8 . </think> \\boxed{85}

A *carry* question (the ones digits sum to 10 or more; 45% of them) needs the ``+ 1`` in its tens column.
The questions are split once, by a fixed seed that no run changes (:func:`splits`): a held-out split that no
row trains on, the RL training split, and a pool the models are fine-tuned on, disjoint from both.

The models, fine-tuned here from a random tiny Qwen3 (:data:`MODEL`) and cached on disk, are calibrated
mixtures, as ``tests/boxed_models.py``'s are: each is trained on the exact distribution of the completions
it should write, so that sampling at temperature 1 reproduces it.

* The student (:data:`STUDENT`) is the learner the paper describes: it works every column right, but on a
  carry question it forgets the carry (``slip``: always, in the second design; 0.97 in the first, see
  docs/learning.md), and it copies the ones digit into the box wrong with probability ``box_error`` (0.25)
  on any question. So it is right on about three quarters of the no-carry questions and never on a carry
  question alone: those are hard for it, and its groups there are all wrong (the group GRPO discards).
* It can read the paper's prompt formats. Under a BCQ prompt (two ``<candidate>`` blocks, one right and
  one wrong, anonymised and shuffled) it follows one of the two candidates, at random (it cannot tell
  which is right), with probability ``follow`` (0.7), writing that candidate's working and answer;
  otherwise it answers as it would without the block. Under an NCQ prompt it avoids each mistake whose
  answer the block lists as wrong with probability ``avoid`` (0.3). That is the zone of proximal
  development in miniature: inside a BCQ prompt the student is right on a carry question about a third
  of the time, alone never.
* The teacher (:data:`TEACHER`) slips on a carry with probability 0.1 and miscopies with 0.05 (right on
  about 91% of the questions), and answers the paper's compression prompt with the response's working and
  boxed answer inside ``<summary>`` tags: what the compressed candidate of a BCQ or NCQ prompt then shows.

Nothing here imports the trainer; ``zppo_trl.prompts`` renders every prompt, as the trainer renders it.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from zppo_trl.prompts import (
    BCQ_INSTRUCTION,
    COMPRESSION_TEMPLATE,
    NCQ_INSTRUCTION,
    RL_CLOSER,
    bcq_block,
    compose_prompt,
    ncq_block,
    render_compression,
)

__all__ = [
    "MODEL",
    "STUDENT",
    "TEACHER",
    "Behaviour",
    "Question",
    "bcq_outcomes",
    "cached_models",
    "candidate",
    "ncq_outcomes",
    "plain_outcomes",
    "prompt_text",
    "splits",
]

EOS = "<|im_end|>"
PAD = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


# ------------------------------------------------------------------ the questions


@dataclass(frozen=True)
class Question:
    """``What is a + b?``; ``id`` is ``"a+b"``."""

    a: int
    b: int

    @property
    def id(self) -> str:
        return f"{self.a}+{self.b}"

    @property
    def text(self) -> str:
        return f"What is {self.a} + {self.b}?"

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def carry(self) -> bool:
        return self.a % 10 + self.b % 10 >= 10

    def row(self) -> dict:
        """The question as a row of ZPPO's dataset schema (zppo_trl.data)."""
        return {
            "id": self.id,
            "question": self.text,
            "images": [],
            "answer": self.answer,
            "source": "addition",
            "subdataset": "carry" if self.carry else "no-carry",
        }


ALL_QUESTIONS = [Question(a, b) for a in range(10, 100) for b in range(10, 100)]
SPLIT_SEED = 20261129  # part of the design: no run changes it
HELDOUT_SIZE = 400
TRAIN_SIZE = 1000


def splits() -> dict[str, list[Question]]:
    """The fixed, disjoint splits: ``heldout`` (scored, never trained on), ``train`` (the RL rows' dataset) and
    ``pool`` (what the models are fine-tuned on; everything else)."""
    questions = list(ALL_QUESTIONS)
    random.Random(SPLIT_SEED).shuffle(questions)
    heldout, train = questions[:HELDOUT_SIZE], questions[HELDOUT_SIZE : HELDOUT_SIZE + TRAIN_SIZE]
    return {"heldout": heldout, "train": train, "pool": questions[HELDOUT_SIZE + TRAIN_SIZE :]}


# ------------------------------------------------------------------ what the models write


def working(q: Question, slip: bool = False, box_error: bool = False) -> tuple[str, str]:
    """One solution's working (the think block's content) and boxed answer: right, or with the carry forgotten
    (``slip``, carry questions only) and/or the ones digit miscopied into the box (``box_error``: one more)."""
    a1, a0, b1, b0 = q.a // 10, q.a % 10, q.b // 10, q.b % 10
    ones = a0 + b0
    carried = q.carry and not slip
    tens_sum = a1 + b1 + (1 if carried else 0)
    tens = f"{a1} + {b1} + 1 = {tens_sum}" if carried else f"{a1} + {b1} = {tens_sum}"
    digit = (ones % 10 + (1 if box_error else 0)) % 10
    return f"{a0} + {b0} = {ones} . {tens} .", str(tens_sum * 10 + digit)


def completion(work: str, answer: str) -> str:
    """A response as the model writes it (EOS excluded): the working in think tags, then the boxed answer."""
    return f"<think> {work} </think> \\boxed{{{answer}}}"


def summary(work: str, answer: str) -> str:
    """The teacher's reply to the compression prompt for a response with this working and answer."""
    return f"<summary> {work} \\boxed{{{answer}}} </summary>"


def candidate(work: str, answer: str) -> str:
    """A compressed candidate as it enters a BCQ/NCQ block (what ``extract_summary`` takes from the reply)."""
    return f"{work} \\boxed{{{answer}}}"


@dataclass(frozen=True)
class Behaviour:
    """How a model answers: its probabilities of forgetting a carry and of miscopying the box, and under the
    paper's reformulated prompts of following a BCQ candidate and of avoiding a mistake an NCQ block lists."""

    slip: float
    box_error: float
    follow: float = 0.0
    avoid: float = 0.0


# The second design's student (docs/learning.md): the first design's forgot the carry with probability 0.97, right
# on 1-2% of the carry questions alone, enough for GRPO† to learn the carry from its own rare successes.
STUDENT = Behaviour(slip=1.0, box_error=0.25, follow=0.7, avoid=0.3)
TEACHER = Behaviour(slip=0.1, box_error=0.05)


def _merge(pairs: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """Identical completions summed, zero weights dropped, in first-seen order."""
    merged: dict[str, float] = {}
    for text, weight in pairs:
        if weight > 0:
            merged[text] = merged.get(text, 0.0) + weight
    return list(merged.items())


def plain_outcomes(q: Question, slip: float, box_error: float) -> list[tuple[tuple[str, str], float]]:
    """``((working, answer), probability)`` of every solution a model with these error rates writes."""
    out = []
    for slipped in (False, True) if q.carry else (False,):
        p_slip = (slip if slipped else 1 - slip) if q.carry else 1.0
        for miscopied in (False, True):
            out.append((working(q, slipped, miscopied), p_slip * (box_error if miscopied else 1 - box_error)))
    return [(solution, p) for solution, p in out if p > 0]


def accuracy(q: Question, behaviour: Behaviour) -> float:
    """The probability that a plain answer of ``behaviour`` to ``q`` is right."""
    return sum(p for (_, answer), p in plain_outcomes(q, behaviour.slip, behaviour.box_error) if answer == q.answer)


def bcq_outcomes(q: Question, candidates: Sequence[tuple[str, str]], behaviour: Behaviour) -> list[tuple[str, float]]:
    """The student's completions to a BCQ prompt showing ``candidates`` (working, answer), with probabilities."""
    pairs = [(completion(*c), behaviour.follow / len(candidates)) for c in candidates]
    pairs += [
        (completion(*s), (1 - behaviour.follow) * p) for s, p in plain_outcomes(q, behaviour.slip, behaviour.box_error)
    ]
    return _merge(pairs)


def ncq_outcomes(q: Question, listed: Sequence[str], behaviour: Behaviour) -> list[tuple[str, float]]:
    """The student's completions to an NCQ prompt listing the wrong answers ``listed``: each of its mistakes
    whose answer is listed is avoided with probability ``avoid``."""
    slip_answer = working(q, slip=True)[1] if q.carry else None
    slip = behaviour.slip * ((1 - behaviour.avoid) if slip_answer in listed else 1.0)
    # a miscopy is listed when the wrong answer it gives is (with the carry right, the usual case under NCQ)
    miscopy = working(q, box_error=True)[1]
    box_error = behaviour.box_error * ((1 - behaviour.avoid) if miscopy in listed else 1.0)
    return _merge([(completion(*s), p) for s, p in plain_outcomes(q, slip, box_error)])


def prompt_text(q: Question, block: str | None = None) -> str:
    """The student's prompt text, as the trainer composes it (question, block, the paper's RL closer)."""
    return compose_prompt(q.text, block, RL_CLOSER)


# ------------------------------------------------------------------ tokenizer and models

# A tiny Qwen3, the tests' size (tests/tiny_models.py): two layers, hidden size 64, head_dim 64 (vLLM's CPU
# attention has no kernel for smaller heads). Trained here it works two-digit sums on questions it never saw.
MODEL = dict(
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,  # what the test servers ask of a model (tests/servers.py)
    tie_word_embeddings=True,
)


def build_tokenizer():
    """A byte-level BPE tokenizer trained in-process on the paper's templates, each digit (with the space before
    it) a token of its own, with a Qwen-style chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r" ?\d"), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=[PAD, "<|im_start|>", EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    example = Question(47, 38)
    corpus = [RL_CLOSER, BCQ_INSTRUCTION, NCQ_INSTRUCTION, COMPRESSION_TEMPLATE, "user\nassistant\n", example.text]
    corpus += [completion(*working(example)), summary(*working(example)), "<candidate>\n</candidate>"]
    backend.train_from_iterator(corpus * 8, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS, pad_token=PAD)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# ------------------------------------------------------------------ fine-tuning


@dataclass(frozen=True)
class Example:
    """One fine-tuning example: a prompt (user text, rendered with the chat template) and the completion to fit,
    drawn from the completions' distribution."""

    prompt: str
    target: str


def _draw(rng: random.Random, outcomes: Sequence[tuple[str, float]]) -> str:
    texts, weights = zip(*outcomes)
    return rng.choices(texts, weights)[0]


def _wrong_solution(rng: random.Random, q: Question, behaviour: Behaviour) -> tuple[str, str] | None:
    """One wrong plain solution of ``behaviour`` to ``q``, drawn among its wrong ones (None: it has none)."""
    wrong = [(s, p) for s, p in plain_outcomes(q, behaviour.slip, behaviour.box_error) if s[1] != q.answer]
    if not wrong:
        return None
    solutions, weights = zip(*wrong)
    return rng.choices(solutions, weights)[0]


def teacher_example(rng: random.Random, pool: Sequence[Question], kind: str) -> Example:
    """A teacher example: a plain answer (``kind="plain"``), or a compression of a response of any kind."""
    q = rng.choice(pool)
    if kind == "plain":
        outcomes = [(completion(*s), p) for s, p in plain_outcomes(q, TEACHER.slip, TEACHER.box_error)]
        return Example(prompt_text(q), _draw(rng, outcomes))
    slipped, miscopied = q.carry and rng.random() < 0.5, rng.random() < 0.3
    solution = working(q, slipped, miscopied)
    return Example(render_compression(completion(*solution)), summary(*solution))


def student_example(rng: random.Random, pool: Sequence[Question], kind: str, group_size: int = 8) -> Example:
    """A student example under a plain, BCQ or NCQ prompt, its candidates as the trainer builds them from the
    teacher's compressions: BCQ shows a right teacher answer and a wrong student one, shuffled; NCQ every
    wrong one of ``group_size`` student answers, each distinct answer listed once."""
    while True:
        q = rng.choice(pool)
        if kind == "plain":
            return Example(
                prompt_text(q),
                _draw(rng, [(completion(*s), p) for s, p in plain_outcomes(q, STUDENT.slip, STUDENT.box_error)]),
            )
        wrong = _wrong_solution(rng, q, STUDENT)
        if wrong is None:
            continue
        if kind == "bcq":
            shown = [working(q), wrong]
            rng.shuffle(shown)
            block = bcq_block([candidate(*c) for c in shown])
            return Example(prompt_text(q, block), _draw(rng, bcq_outcomes(q, shown, STUDENT)))
        answers = [
            s
            for s in (
                _draw(rng, [(s, p) for s, p in plain_outcomes(q, STUDENT.slip, STUDENT.box_error)])
                for _ in range(group_size)
            )
            if s[1] != q.answer
        ]
        if not answers:
            continue
        listed = [a for _, a in answers]
        block = ncq_block(listed, [candidate(*s) for s in answers])
        return Example(prompt_text(q, block), _draw(rng, ncq_outcomes(q, listed, STUDENT)))


def chat(tokenizer, user_text: str) -> str:
    """``user_text`` as the generation prompt the trainer gives the model (chat template, generation prompt)."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
    )


def _batch(tokenizer, examples: Sequence[Example]):
    """Right-padded inputs with labels on the completion and its EOS only."""

    prompts = [chat(tokenizer, e.prompt) for e in examples]
    texts = [p + e.target + EOS for p, e in zip(prompts, examples)]
    tokenizer.padding_side = "right"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].clone()
    labels[batch["attention_mask"] == 0] = -100
    for i, prompt in enumerate(prompts):
        labels[i, : len(tokenizer(prompt)["input_ids"])] = -100
    return batch, labels


def _loss(model, batch, labels):
    """Mean over sequences of each completion's summed cross-entropy."""
    import torch.nn.functional as F

    logits = model(**batch).logits[:, :-1]
    targets = labels[:, 1:]
    token_loss = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100, reduction="none"
    )
    return token_loss.view(targets.shape).sum(1).mean()


@dataclass(frozen=True)
class Fit:
    """A fine-tuning run: ``steps`` AdamW steps over fresh examples, ``mix`` of them per step by kind."""

    steps: int
    mix: tuple[tuple[str, int], ...]
    learning_rate: float = 3e-3
    warmup: int = 50


TEACHER_FIT = Fit(steps=1200, mix=(("plain", 24), ("compression", 8)))
STUDENT_FIT = Fit(steps=1200, mix=(("plain", 16), ("bcq", 8), ("ncq", 4)))


def fit(model, tokenizer, role: str, settings: Fit, seed: int, pool: Sequence[Question], log=print) -> None:
    """Fine-tune ``model`` as ``role`` (``teacher`` or ``student``) on examples drawn from ``pool``."""
    import torch

    rng = random.Random(seed)
    torch.manual_seed(seed)
    draw = teacher_example if role == "teacher" else student_example
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, betas=(0.9, 0.98), weight_decay=0.0)

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / settings.warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / settings.steps)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    start = time.monotonic()
    for step in range(settings.steps):
        losses = {}
        optimizer.zero_grad()
        total = sum(n for _, n in settings.mix)
        for kind, n in settings.mix:
            loss = _loss(model, *_batch(tokenizer, [draw(rng, pool, kind) for _ in range(n)]))
            (loss * n / total).backward()
            losses[kind] = loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == settings.steps - 1:
            parts = ", ".join(f"{k} {v:.3f}" for k, v in losses.items())
            log(f"{role} fit: step {step}/{settings.steps}, loss {parts} ({time.monotonic() - start:.0f} s)")
    model.eval()


def sample(
    model,
    tokenizer,
    user_texts: Sequence[str],
    n: int = 1,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    batch_size: int = 256,
    **kwargs,
) -> list[list[str]]:
    """``n`` sampled completions per prompt (decoded without special tokens), in-process."""
    import torch

    prompts = [chat(tokenizer, t) for t in user_texts for _ in range(n)]
    tokenizer.padding_side = "left"
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(
                **batch,
                do_sample=True,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **kwargs,
            )
        texts += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return [texts[i * n : (i + 1) * n] for i in range(len(user_texts))]


def new_model(tokenizer, seed: int):
    """A random tiny Qwen3 (:data:`MODEL`) for ``tokenizer``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **MODEL,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


# ------------------------------------------------------------------ the on-disk cache

FIT_SEED = (
    0  # part of the design: every run starts from the same fine-tuned student, as the paper's from one checkpoint
)
DEFAULT_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "learning-models"


def recipe_key(fits: dict[str, Fit]) -> str:
    """A hash of what the models are a function of: this file, the prompt templates, the fits and the libraries."""
    import tokenizers
    import torch
    import transformers

    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update((Path(__file__).resolve().parents[1] / "zppo_trl" / "prompts.py").read_bytes())
    digest.update(repr(sorted((role, asdict(f)) for role, f in fits.items())).encode())
    digest.update(f"{torch.__version__} {transformers.__version__} {tokenizers.__version__}".encode())
    return digest.hexdigest()[:12]


def fit_model(role: str, directory: str | Path, settings: Fit, log=print) -> Path:
    """Fit ``role`` from a random tiny model on the pool split and save it (with its tokenizer) to ``directory``."""
    tokenizer = build_tokenizer()
    model = new_model(tokenizer, FIT_SEED)
    fit(model, tokenizer, role, settings, FIT_SEED, splits()["pool"], log)
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def cached_models(
    cache_dir: str | Path = DEFAULT_CACHE, fits: dict[str, Fit] | None = None, log=print
) -> dict[str, Path]:
    """The fine-tuned ``student`` and ``teacher`` directories, fitted first where absent: both at once, in a
    process each on one thread (about 11 minutes on 2 cores of an AMD EPYC, then seconds)."""
    import os
    import subprocess
    import sys

    fits = fits or {"teacher": TEACHER_FIT, "student": STUDENT_FIT}
    root = Path(cache_dir) / recipe_key(fits)
    targets = {role: root / role for role in fits}
    missing = [role for role, path in targets.items() if not (path / "config.json").exists()]
    processes = {}
    for role in missing:
        root.mkdir(parents=True, exist_ok=True)
        scratch = root / f"{role}.partial"
        steps = fits[role].steps
        log(f"fitting the {role} ({steps} steps) into {targets[role]}; log: {root / f'{role}.log'}")
        command = [sys.executable, __file__, "fit", role, str(scratch), "--steps", str(steps)]
        with open(root / f"{role}.log", "w") as out:
            processes[role] = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error"),
            )
    for role, process in processes.items():
        if process.wait() != 0:
            tail = (root / f"{role}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"fitting the {role} failed (exit {process.returncode}):\n{tail}")
        (root / f"{role}.partial").rename(targets[role])
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    """``python benchmarks/learning_task.py fit ROLE DIR [--steps N]``: what :func:`cached_models` runs per model."""
    import argparse
    import dataclasses

    import torch

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("command", choices=["fit"])
    parser.add_argument("role", choices=["student", "teacher"])
    parser.add_argument("directory")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings = TEACHER_FIT if args.role == "teacher" else STUDENT_FIT
    if args.steps is not None:
        settings = dataclasses.replace(settings, steps=args.steps)
    fit_model(args.role, args.directory, settings, log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
