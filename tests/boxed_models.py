"""Tiny students and teachers that answer toy arithmetic in the paper's format.

Random tiny models never write ``\\boxed{}``, so trainer tests could only ever see reward 0.
:func:`train_boxed_model` fine-tunes :mod:`tiny_models`' text model or VLM for seconds to
answer :data:`TOY_QUESTIONS` as ``<think> ... </think> \\boxed{N}<|im_end|>``, on prompts
rendered exactly as the trainer renders them (the RL closer appended, the chat template with
a generation prompt, the image through the processor).

The completions are a calibrated mix of right and wrong: a student answers question q
correctly with probability :data:`STUDENT_ACCURACY` [q] (hard, middling and easy questions)
and otherwise gives one of two fixed distractors, so its wrong answers repeat like a real
student's; a teacher is right with probability :data:`TEACHER_ACCURACY` on every question.
Training minimises the cross-entropy against that mixture (each completion weighted by its
probability), so sampling at temperature 1 reproduces it, give or take a sample in 8.

Two opt-in options of :func:`train_boxed_model` (the benchmarks' models; the tests use neither) change
what is learnt: ``accuracy`` replaces the role's probabilities of a right answer, and ``completion_tokens``
pads every answer after its box with :data:`FILLER` to that many tokens (:func:`padded_completion`), so a
response forced to run to that length (vLLM's ``min_tokens``, ``generate``'s ``min_new_tokens``) still
ends with the answer the model chose: a forced continuation after EOS is out of distribution and writes
more ``\\boxed{}`` (the last one counts), which leaves these models right on almost nothing.

Gotcha: the tokenizer is saved first and training tokenizes with the copy reloaded from
disk, because that is what the trainer and ``transformers serve`` will use: the VLM's
tokenizer reloads as ``Qwen3_5Tokenizer``, which splits digits differently from the
in-memory tokenizer it was saved from.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from zppo_trl.prompts import compose_prompt, render_compression, render_correction, render_hint, render_reflection

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from tiny_models import tiny_processor, tiny_text_model, tiny_tokenizer, tiny_vlm
except ImportError:
    from tests.tiny_models import tiny_processor, tiny_text_model, tiny_tokenizer, tiny_vlm

if TYPE_CHECKING:  # annotations only: torch is imported where the models are trained
    import torch

logger = logging.getLogger(__name__)

__all__ = [
    "COMPRESSION_REPLY",
    "MODELS",
    "STUDENT_ACCURACY",
    "TEACHER_ACCURACY",
    "TOY_QUESTIONS",
    "boxed_model",
    "cached_model_dir",
    "completion",
    "distractors",
    "padded_completion",
    "recipe_key",
    "toy_conversation",
    "toy_image",
    "toy_rows",
    "train_boxed_model",
]

EOS = "<|im_end|>"
THINK = "<think> Let me compute. </think> "

_OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_PROBLEMS = [
    (17, "+", 25), (48, "-", 19), (6, "*", 7), (33, "+", 58), (91, "-", 46), (8, "*", 9),
    (24, "+", 39), (75, "-", 28), (12, "*", 5), (66, "+", 17), (53, "-", 37), (9, "*", 4),
    (45, "+", 45), (82, "-", 55), (7, "*", 8), (29, "+", 64),
]  # fmt: skip

TOY_QUESTIONS = [
    {
        "id": f"toy-{i:02d}",
        "question": f"What is {a} {op} {b}?",
        "images": [],
        "answer": str(_OPERATIONS[op](a, b)),
        "source": "toy",
        "subdataset": "arithmetic",
    }
    for i, (a, op, b) in enumerate(_PROBLEMS)
]

# The student's probability of answering each question right, cycling hard / middling / easy:
# six questions near 0 (the student alone never learns them), five near 1/3, five near 1.
_TIERS = ([0.0, 0.1, 0.05, 0.15, 0.0, 0.1], [0.3, 0.4, 0.35, 0.3, 0.4], [0.9, 1.0, 0.85, 0.95, 0.9])
STUDENT_ACCURACY = {row["id"]: _TIERS[i % 3][i // 3] for i, row in enumerate(TOY_QUESTIONS)}
TEACHER_ACCURACY = 0.8

LEARNING_RATE = 1e-2
# After its warm-up, the learning rate falls to a tenth of LEARNING_RATE on a half cosine over this many steps
# (then stays there): the text teacher's answers converge in 84 steps where a constant rate took 125.
DECAY_STEPS = 100
MAX_STEPS = 300
# Stop once the loss is this many nats per question above its floor (the answers' entropy):
# close enough for sampling to reproduce the accuracies above, give or take a sample in 8.
TOLERANCE = {"teacher": 0.3, "student": 0.15}

_TEACHER_WEIGHTS: dict[tuple[str, int], dict] = {}  # (kind, seed) -> trained teacher state dict


def distractors(row: dict) -> list[str]:
    """The two fixed wrong answers to ``row``: off by one, and a carry slip (off by ten)."""
    answer = int(row["answer"])
    return [str(answer + 1), str(answer + 10)]


def completion(answer: str) -> str:
    """A target completion: a short think, the boxed answer, then EOS."""
    return f"{THINK}\\boxed{{{answer}}}{EOS}"


# What a padded completion repeats after its box: two tokens that never start a box.
FILLER = " ."


def padded_completion(answer: str, tokens: int, tokenizer) -> str:
    """A target completion that runs to ``tokens`` tokens (of ``tokenizer``): the short think, the boxed answer,
    then :data:`FILLER` until the length is reached, and no EOS (a model trained on it writes until it is
    stopped, so a response runs to its length whether or not the engine forces it)."""
    text = f"{THINK}\\boxed{{{answer}}}"
    count = lambda s: len(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    return text + FILLER * max(0, math.ceil((tokens - count(text)) / count(FILLER)))


def _accuracy(row: dict, role: str, accuracy: float | Mapping[str, float] | None) -> float:
    """The probability that ``role`` answers ``row`` right: ``accuracy`` (one number, or one per question id)
    when given, else :data:`STUDENT_ACCURACY` or :data:`TEACHER_ACCURACY`."""
    if accuracy is None:
        return STUDENT_ACCURACY[row["id"]] if role == "student" else TEACHER_ACCURACY
    return float(accuracy) if isinstance(accuracy, (int, float)) else accuracy[row["id"]]


def _targets(
    row: dict, role: str, accuracy: float | Mapping[str, float] | None = None, write=completion
) -> list[tuple[str, float]]:
    """``(completion, probability)`` pairs for one question (zero-probability ones left out); ``write`` renders
    an answer as a completion."""
    p = _accuracy(row, role, accuracy)
    wrong = distractors(row)
    pairs = [(write(row["answer"]), p)] + [(write(w), (1 - p) / len(wrong)) for w in wrong]
    return [(text, weight) for text, weight in pairs if weight > 0]


def toy_image(row: dict):
    """A deterministic 32x32 image for ``row``: a solid colour with a lighter square."""
    from PIL import Image, ImageDraw

    i = int(row["id"].split("-")[1])
    image = Image.new("RGB", (32, 32), ((37 * i) % 256, (91 * i + 60) % 256, (53 * i + 120) % 256))
    ImageDraw.Draw(image).rectangle([8, 8, 8 + i, 8 + i], fill=(255, 255, 255))
    return image


def toy_rows(kind: str = "text") -> list[dict]:
    """Fresh copies of :data:`TOY_QUESTIONS`; for ``kind="vlm"`` each row carries one image."""
    if kind not in ("text", "vlm"):
        raise ValueError(f"kind must be 'text' or 'vlm', got {kind!r}")
    return [{**row, "images": [toy_image(row)] if kind == "vlm" else []} for row in TOY_QUESTIONS]


def toy_conversation(row: dict, image_part: dict | None = None) -> list[dict]:
    """The trainer's conversational prompt for ``row``: one user turn ending with the RL closer.

    Rows with images get TRL's multimodal content (an image part, then the text);
    ``image_part`` replaces the bare ``{"type": "image"}`` placeholder (e.g. to carry the
    image itself, as a teacher request must).
    """
    text = compose_prompt(row["question"])
    if not row["images"]:
        return [{"role": "user", "content": text}]
    return [{"role": "user", "content": [image_part or {"type": "image"}, {"type": "text", "text": text}]}]


def train_boxed_model(
    directory: str | Path,
    role: str = "student",
    kind: str = "text",
    seed: int = 0,
    seconds_budget: float | None = None,
    teacher_dir: str | Path | None = None,
    accuracy: float | Mapping[str, float] | None = None,
    completion_tokens: int | None = None,
) -> Path:
    """Fine-tune a tiny model to answer the toy questions as ``role`` would; save it to ``directory``.

    A teacher is trained from :mod:`tiny_models`' random model; a student is fine-tuned from
    that teacher, which is several times faster than from scratch since the format and the
    questions are learnt already: from the teacher saved in ``teacher_dir`` when given, else from
    the one trained in this process (its weights are kept in memory, once per process, kind and
    seed). Each stage stops once its loss is close to its minimum (:data:`TOLERANCE`), after
    :data:`MAX_STEPS`, or when ``seconds_budget`` (per stage) runs out; the last two are
    logged as warnings (the model may be under-trained). Without a budget the result depends
    only on ``role``, ``kind`` and ``seed``. ``directory`` ends up loadable by
    ``from_pretrained`` (with the tokenizer, or for a VLM the processor) and by
    ``transformers serve``.

    Opt-in (the tests use neither): ``accuracy`` is the probability of a right answer, one number or one per
    question id, in place of :data:`STUDENT_ACCURACY` / :data:`TEACHER_ACCURACY`; ``completion_tokens`` trains
    every answer as :func:`padded_completion` of that many tokens, and a teacher then learns the answers and
    the compression prompt only (no hint or revision requests, whose prompts would carry several such
    answers). A student fine-tuned from ``teacher_dir`` should be given the same ``completion_tokens``; one
    fine-tuned from the in-memory teacher gets a teacher trained with these same options (kept apart from
    the default one).
    """
    if role not in ("student", "teacher"):
        raise ValueError(f"role must be 'student' or 'teacher', got {role!r}")
    if kind not in ("text", "vlm"):
        raise ValueError(f"kind must be 'text' or 'vlm', got {kind!r}")
    directory = Path(directory)
    model = tiny_text_model(seed) if kind == "text" else tiny_vlm(seed)
    processing = _save_and_reload_processing(directory, model.config)
    # The in-memory teacher of the default recipe is kept under (kind, seed); one trained with options, with them.
    teacher_accuracy = accuracy if role == "teacher" else None
    teacher_key: tuple = (kind, seed)
    if teacher_accuracy is not None or completion_tokens is not None:
        frozen = tuple(sorted(teacher_accuracy.items())) if isinstance(teacher_accuracy, Mapping) else teacher_accuracy
        teacher_key += (frozen, completion_tokens)
    with _single_threaded():
        if role == "student" and teacher_dir is not None:
            model = type(model).from_pretrained(teacher_dir)
        elif teacher_key in _TEACHER_WEIGHTS:
            model.load_state_dict(_TEACHER_WEIGHTS[teacher_key])
        else:
            _fit(model, processing, kind, "teacher", seed, seconds_budget, 20, teacher_accuracy, completion_tokens)
            _TEACHER_WEIGHTS[teacher_key] = {
                name: tensor.detach().clone() for name, tensor in model.state_dict().items()
            }
        if role == "student":
            _fit(model, processing, kind, "student", seed, seconds_budget, 5, accuracy, completion_tokens)
    model.save_pretrained(directory)
    return directory


# ---------------------------------------------------------------- the on-disk cache

# What a boxed model is a function of: this file (the data, the targets, the fit), the tiny models, the prompt
# templates and the processor loading the training renders with, and the libraries that run the fit.
_RECIPE_FILES = [
    Path(__file__),
    Path(__file__).with_name("tiny_models.py"),
    Path(__file__).resolve().parents[1] / "zppo_trl" / "prompts.py",
    Path(__file__).resolve().parents[1] / "zppo_trl" / "processing.py",
]
# The on-disk cache: .cache/boxed-models in the checkout, or ZPPO_BOXED_CACHE (an empty directory gives a cold run).
DEFAULT_CACHE = Path(
    os.environ.get("ZPPO_BOXED_CACHE") or Path(__file__).resolve().parents[1] / ".cache" / "boxed-models"
)
MODELS = [("text", "teacher"), ("text", "student"), ("vlm", "teacher"), ("vlm", "student")]


def recipe_key() -> str:
    """A content hash of everything a boxed model is trained from (files and library versions)."""
    import hashlib

    import tokenizers
    import torch
    import transformers

    digest = hashlib.sha256()
    for path in _RECIPE_FILES:
        digest.update(path.read_bytes())
    digest.update(f"{torch.__version__} {transformers.__version__} {tokenizers.__version__}".encode())
    return digest.hexdigest()[:16]


def cached_model_dir(role: str, kind: str, seed: int = 0, cache_dir: str | Path | None = None) -> Path:
    """Where :func:`boxed_model` keeps ``role``/``kind``/``seed`` (it may not exist yet)."""
    return Path(cache_dir or DEFAULT_CACHE) / recipe_key() / f"{kind}-{role}-seed{seed}"


def boxed_model(role: str, kind: str, seed: int = 0, cache_dir: str | Path | None = None) -> Path:
    """The boxed ``role``/``kind`` model from the cache under ``cache_dir``, trained into it first if absent.

    Entries are keyed by :func:`recipe_key`, so a change to the recipe trains afresh and a second run on
    the same machine reuses the first's models. A file lock per entry lets several processes ask at once
    (the test session and its background pre-training): one trains, the others wait for it. An entry
    appears whole or not at all (trained beside it, then renamed). A student's lock is taken before its
    teacher's, by every caller, so two callers never wait on each other.
    """
    from filelock import FileLock

    target = cached_model_dir(role, kind, seed, cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not target.is_dir():
            teacher = boxed_model("teacher", kind, seed, cache_dir) if role == "student" else None
            scratch = target.with_name(f"{target.name}.partial")
            if scratch.exists():  # left by a process killed mid-fit
                import shutil

                shutil.rmtree(scratch)
            start = time.monotonic()
            train_boxed_model(scratch, role=role, kind=kind, seed=seed, teacher_dir=teacher)
            scratch.rename(target)
            logger.info("boxed %s %s: trained into %s in %.1f s", kind, role, target, time.monotonic() - start)
    return target


def start_background(models: list[tuple[str, str]], cache_dir: str | Path, log_path: str | Path) -> subprocess.Popen:
    """Train ``models`` (``(kind, role)`` pairs) into ``cache_dir`` in a process of its own session (a signal to the
    caller's process group does not reach it), its output in ``log_path``; returns at once."""
    command = [sys.executable, str(Path(__file__).resolve()), "--cache-dir", str(cache_dir)]
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            command + [f"{kind}-{role}" for kind, role in models],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error"),
            start_new_session=True,
        )


def main(argv: list[str] | None = None) -> int:
    """``python tests/boxed_models.py [--cache-dir DIR] [--detach] [KIND-ROLE ...]``: train the boxed models into the
    cache.

    The test session runs this in the background while its other tests run (tests/conftest.py), and ``make test``
    starts it with ``--detach`` as soon as ``.venv`` exists, so that the fit overlaps the vLLM environment's
    install; by hand it fills the cache ahead of a run. Prints each model's directory as it is ready.
    """
    import argparse

    names = [f"{kind}-{role}" for kind, role in MODELS]
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("models", nargs="*", metavar="KIND-ROLE", help=f"any of {names} (default: all)")
    parser.add_argument(
        "--cache-dir", default=str(DEFAULT_CACHE), help="default: ZPPO_BOXED_CACHE or .cache/boxed-models"
    )
    parser.add_argument(
        "--detach",
        action="store_true",
        help="train in a background process and return at once (its log: CACHE_DIR/background.log); "
        "nothing is started while an earlier one still runs",
    )
    args = parser.parse_args(argv)
    for name in args.models:  # (argparse's choices reject an empty list for nargs="*" on Python 3.11)
        if name not in names:
            parser.error(f"unknown model {name!r}: choose from {names}")
    args.models = args.models or names
    if args.detach:
        cache = Path(args.cache_dir)
        cache.mkdir(parents=True, exist_ok=True)
        pid_file = cache / "background.pid"
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(pid_file.read_text()), 0)  # raises where no such process runs
            print(f"the boxed models are already training in the background (pid {pid_file.read_text()})")
            return 0
        models = [tuple(name.split("-")) for name in args.models]
        process = start_background(models, cache, cache / "background.log")
        pid_file.write_text(str(process.pid))
        print(f"training the boxed models in the background (pid {process.pid}, log {cache / 'background.log'})")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for name in args.models:
        kind, role = name.split("-")
        print(boxed_model(role, kind, cache_dir=args.cache_dir), flush=True)
    return 0


@contextlib.contextmanager
def _single_threaded():
    """Run torch on one intra-op thread meanwhile (restored afterwards).

    On a busy machine (servers, benchmarks, other tests) two threads on two cores are
    oversubscribed and a training step of these tiny models runs about 20x slower (2.9 s
    against 0.12 s measured); one thread costs about 1.5x on an idle machine, and its
    results do not depend on the load.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _fit(
    model,
    processing,
    kind: str,
    role: str,
    seed: int,
    seconds_budget: float | None,
    warmup_steps: int,
    accuracy: float | Mapping[str, float] | None = None,
    completion_tokens: int | None = None,
) -> None:
    """Full-batch AdamW on ``role``'s examples until the loss is within :data:`TOLERANCE` of its floor.

    Linear warm-up, then a cosine decay to a tenth (:data:`DECAY_STEPS`), gradient norm clipped
    to 1, the loss on completion tokens only and weighted per sequence (see
    :func:`_training_batches`); the floor is the entropy of the answer mixture. The text
    teacher's revision requests (three fifths of its tokens, in prompts four times as long)
    join once the rest is fitted: the answers it writes there are the ones it has learnt by
    then, and full-batch steps over everything from the start cost about twice the time.
    Leaves ``model`` in eval mode. ``accuracy`` and ``completion_tokens``: see :func:`train_boxed_model`.
    """
    import torch

    rows = toy_rows(kind)
    batches, revisions = _training_batches(processing, rows, role, kind, accuracy, completion_tokens)
    stages = [batches, batches + revisions] if revisions else [batches]
    floor = -sum(w * math.log(w) for row in rows for _, w in _targets(row, role, accuracy)) / len(rows)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.99), weight_decay=0.0)

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup_steps) * (
            0.55 + 0.45 * math.cos(math.pi * min(step, DECAY_STEPS) / DECAY_STEPS)
        )

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model.train()
    start, step, loss = time.monotonic(), 0, float("inf")
    for stage in stages:
        loss = float("inf")
        while loss - floor > TOLERANCE[role]:
            if step == MAX_STEPS or (seconds_budget is not None and time.monotonic() - start > seconds_budget):
                logger.warning(
                    "boxed %s %s: stopped early after %d steps, loss %.3f (floor %.3f)", kind, role, step, loss, floor
                )
                break
            loss = sum(_weighted_loss(model, batch, weights, len(rows)) for batch, weights in stage)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            loss, step = loss.item(), step + 1
    model.eval()
    logger.info(
        "boxed %s %s: %d steps, %.1f s, loss %.3f (floor %.3f)",
        kind,
        role,
        step,
        time.monotonic() - start,
        loss,
        floor,
    )


def _save_and_reload_processing(directory: Path, config):
    """Save ``config`` and the tokenizer (text) or processor (VLM); return the latter as reloaded from disk."""
    from zppo_trl.processing import load_processor

    config.save_pretrained(directory)
    processing = tiny_tokenizer() if getattr(config, "vision_config", None) is None else tiny_processor()
    processing.save_pretrained(directory)
    return load_processor(str(directory))


COMPRESSION_REPLY = f"<think> </think> <summary> The attempt works it out step by step. </summary>{EOS}"
HINT_REPLY = f"<think> </think> Work out the arithmetic one operation at a time.{EOS}"


def _training_batches(
    processing,
    rows: list[dict],
    role: str,
    kind: str,
    accuracy: float | Mapping[str, float] | None = None,
    completion_tokens: int | None = None,
) -> tuple[list[tuple[dict, torch.Tensor]], list[tuple[dict, torch.Tensor]]]:
    """The (batch, weights) pairs to fit: the answers, and for a teacher also the compressions; then, apart, the
    text teacher's revision requests (empty for the others), one batch per kind of request so that each is padded
    to its own length (a correction prompt is about 280 tokens, a reflection 430-460: a third less to compute).

    A teacher also serves BCQ/NCQ compression, so it learns to answer the paper's compression
    prompt with a non-empty ``<summary>`` (an empty one would drop the instance); the text
    teacher, which the text rows' tests also send their requests, learns the Hint control's hint
    prompt with one fixed answer-free sentence and the supervised controls' correction and
    refinement prompts with the right answer. The VLM teacher is only ever sent rollout and
    compression requests (BCQ/NCQ and Prefix), so it learns only those: the hint and revision
    prompts are long, and through the VLM's linear-attention layers (their PyTorch fallback here)
    they would cost most of its fit. Copying
    the answer into the summary is beyond a model this size, so the summary is one fixed
    sentence, learnt from a few responses in two forms: a completion decoded as the trainer and
    the test servers (raw replies, as vLLM without a reasoning parser) read it back, and a bare
    boxed answer. The compression prompts are text only, in a batch of their own.

    With ``completion_tokens`` every answer is a :func:`padded_completion` (the compressed responses too) and a
    teacher learns no hint or revision request.
    """
    tokenizer = getattr(processing, "tokenizer", processing)
    write = completion if completion_tokens is None else lambda a: padded_completion(a, completion_tokens, tokenizer)
    pairs = []
    for row in rows:
        prompt = processing.apply_chat_template(toy_conversation(row), tokenize=False, add_generation_prompt=True)
        pairs += [
            (prompt + target, row["images"], target, weight) for target, weight in _targets(row, role, accuracy, write)
        ]
    batches = [_training_batch(processing, pairs, with_images=kind == "vlm")]
    if role == "teacher":

        def decode(text: str) -> str:  # a completion as the trainer reads it back
            return tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"], skip_special_tokens=True)

        responses = []
        for row in rows[:4]:
            for answer in (row["answer"], distractors(row)[0]):
                responses += [decode(write(answer)), f"\\boxed{{{answer}}}"]
        revising = kind == "text" and completion_tokens is None
        requests = [(render_compression, COMPRESSION_REPLY)] + ([(render_hint, HINT_REPLY)] if revising else [])
        for render, reply in requests:
            rewrites = []
            for response in responses:
                conversation = [{"role": "user", "content": render(response)}]
                prompt = processing.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
                rewrites.append((prompt + reply, [], reply, len(rows) / len(responses) / 4))
            batches.append(_training_batch(processing, rewrites, with_images=False))
        if not revising:
            return batches, []
        fixes = [[], [], []]  # correction, reflection with 3 wrong rollouts, with 4
        for row in rows:
            right, wrong = (decode(completion(a)) for a in (row["answer"], distractors(row)[0]))
            # A revision request carries every wrong plain rollout of a hard question: 3 or 4 of G = 4
            # with both distractors among them, as the trainer sends it.
            wrongs = [decode(completion(d)) for d in distractors(row)]
            requests = [(render_correction(row["question"], wrong), 1 / 8)]
            requests += [
                (render_reflection(row["question"], right, [wrongs[i % 2] for i in range(n)]), 1 / 8 / 2)
                for n in (3, 4)
            ]
            for same_kind, (request, weight) in zip(fixes, requests):
                conversation = [{"role": "user", "content": request}]
                prompt = processing.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
                same_kind.append((prompt + completion(row["answer"]), [], completion(row["answer"]), weight))
        return batches, [_training_batch(processing, same_kind, with_images=False) for same_kind in fixes]
    return batches, []


def _training_batch(processing, pairs: list[tuple[str, list, str, float]], with_images: bool):
    """Right-padded inputs with ``labels`` on completion tokens only, and one weight per sequence.

    ``pairs`` are ``(prompt + completion, images, completion, weight)``; a completion starts
    and ends with a special token, so the joint text tokenizes as prompt + completion
    (checked here).
    """
    import torch

    tokenizer = getattr(processing, "tokenizer", processing)
    texts = [text for text, *_ in pairs]
    completion_ids = [tokenizer(target, add_special_tokens=False)["input_ids"] for _, _, target, _ in pairs]
    tokenizer.padding_side = "right"
    images = {"images": [row_images for _, row_images, *_ in pairs]} if with_images else {}
    batch = processing(text=texts, padding=True, return_tensors="pt", **images)
    labels = torch.full_like(batch["input_ids"], -100)
    for i, (length, ids) in enumerate(zip(batch["attention_mask"].sum(1).tolist(), completion_ids)):
        tail = batch["input_ids"][i, length - len(ids) : length]
        if tail.tolist() != ids:
            raise AssertionError(f"the completion tokenized differently inside the sequence: {texts[i]!r}")
        labels[i, length - len(ids) : length] = tail
    batch["labels"] = labels
    return dict(batch), torch.tensor([weight for *_, weight in pairs])


def _weighted_loss(model, batch: dict, weights, n_questions: int):
    """Sum over sequences of weight x completion cross-entropy (summed over tokens), per question."""
    import torch.nn.functional as F

    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    token_loss = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100, reduction="none"
    )
    return (token_loss.view(labels.shape).sum(1) * weights).sum() / n_questions


if __name__ == "__main__":
    raise SystemExit(main())
