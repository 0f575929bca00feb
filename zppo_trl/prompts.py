"""Every prompt template of the ZPPO paper, verbatim, and the functions that render them.

The constants are the code-side text of the paper's prompt figures (the RL closer, the BCQ and
NCQ blocks, the compression prompt, the shared judge, the trace-overlap judge, and the baselines' hint, correction and
reflection prompts). Fields written ``{{ name }}`` are
filled at call time by :func:`fill`, in one pass, so text inside a field (a model
response quoting ``{{ question }}``, say) is never substituted again.

This module is pure: no TRL, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "BCQ_INSTRUCTION",
    "COMPRESSION_TEMPLATE",
    "CORRECTION_TEMPLATE",
    "CORRECT_TAG",
    "HINT_TEMPLATE",
    "INCORRECT_TAG",
    "JUDGE_TEMPLATE",
    "MEMORIZATION_JUDGE_TEMPLATE",
    "NCQ_INSTRUCTION",
    "REFLECTION_TEMPLATE",
    "RL_CLOSER",
    "bcq_block",
    "candidate_blocks",
    "compose_prompt",
    "fill",
    "hint_block",
    "ncq_block",
    "render_compression",
    "render_correction",
    "render_hint",
    "render_judge",
    "render_memorization_judge",
    "render_reflection",
]

# The paper's RL closer figure: appended last to every training and evaluation prompt.
RL_CLOSER = (
    "You FIRST think about the reasoning process as an internal monologue and then provide "
    "the final answer. The reasoning process MUST BE enclosed within <think> </think> tags. "
    "The final answer MUST BE put in \\boxed{}."
)

# The paper's BCQ prompt figure: the instruction line; the two shuffled <candidate> blocks follow it.
BCQ_INSTRUCTION = (
    "Here are two candidate responses in <candidate> </candidate> tags to the question above. "
    "One is correct and another is wrong. Use these as references to help you solve the problem."
)

# The paper's NCQ prompt figure: ``{{ answers }}`` is the distinct wrong answers, each as \boxed{a}, joined by ", ".
NCQ_INSTRUCTION = (
    "The following answers are all WRONG: {{ answers }}. "
    "Below are the incorrect reasoning processes in <candidate> </candidate> tags."
)

# The paper's compression prompt figure: the teacher rewrites every BCQ/NCQ candidate under this prompt.
COMPRESSION_TEMPLATE = """Compress the response below into a summary (in 5 lines max).

Rules:
- Response is in <response>...</response> tags
- Summary should be in <summary>...</summary> tags and should be in 5 lines max
- Keep ONLY the essential reasoning steps and the final answer
- Remove ALL exploratory text, self-corrections, retries, and filler
- Do NOT re-derive or add new information
- End with the final answer in \\boxed{} format
<response>
{{ response }}
</response>"""

# The optional section of the judge template (rendered only when options are non-empty).
_JUDGE_OPTIONS_SECTION = "## Answer Options\n{{ options }}\n\n"

# The paper's shared judge prompt figure: the shared judge (training reward fallback and evaluation).
JUDGE_TEMPLATE = (
    """You are an expert judge evaluating whether a model's response is correct according to the ground truth.

## Your Role (READ FIRST)
You are a COMPARATOR, not a solver. Your ONLY job is to decide how well the model's response matches the provided GROUND TRUTH.
- Do NOT attempt to solve the problem yourself.
- Do NOT infer or derive what the "real" answer should be.
- Do NOT second-guess the ground truth, even if it seems wrong.
- The "Model Response" section below MAY be either (a) the model's full trajectory including any <think>...</think> reasoning and a concluding \\boxed{...} answer, OR (b) a short EXTRACTED snippet that was already pulled out as the candidate final answer (e.g. a bare letter like B, a number like 42, an expression like x = 5/3). Treat both forms uniformly: the snippet (when given) IS the model's committed final answer, and a full trajectory's final answer is the content inside the last \\boxed{...} or the concluding sentence AFTER any </think> tag.
- If the final answer is missing due to answer format error, truncation, or other reasons, look inside thinking or reasoning.
- You should OUTPUT JSON with the format {"verdict": "correct" or "wrong"} based on the model's response and the ground truth.

## Question
{{ question }}

"""
    + _JUDGE_OPTIONS_SECTION
    + """## Model Response
{{ model_response }}

## Ground Truth Answer
{{ ground_truth }}

Output ONLY a valid JSON object with exactly this format (no prose, no code fences, no trailing commentary): {"verdict": "correct" or "wrong"}"""
)

# The paper's trace-overlap judge figure (the memorization diagnostic): one student rollout against the fixed
# teacher reference of its question; the three judges answer {"verdict": "transfer" | "memorization"}.
MEMORIZATION_JUDGE_TEMPLATE = """You are an expert LLM-as-a-judge deciding whether a student solved a hard question by transfer (it reconstructed the reasoning itself) or by memorization (it reproduced the teacher correct response it saw during training).

## Your Role (READ FIRST)
You are a COMPARATOR, not a solver. Your ONLY job is to decide, from the teacher correct response and the student response, which of the two the student did.
- Do NOT attempt to solve the problem yourself.
- Do NOT judge whether the final answer is correct.
- A matching final answer is NOT evidence of memorization; ignore the answer and judge ONLY the reasoning trace.

## How to decide
Base your call on the INCIDENTAL, non-forced parts of the reasoning -- the choices the teacher did not have to make: arbitrary variable names or notation, the order of independent steps, a particular intermediate quantity that was not required, idiosyncratic phrasing or asides. These rarely coincide unless copied.

Signs of MEMORIZATION:
- The student reproduces the teacher's incidental choices: same arbitrary notation, same non-required intermediate steps, same ordering, same phrasing.
- The trace reads as a clean, linear restatement of the teacher's, in the same order, with no false starts.
- It uses a teacher-specific detail it could not obtain from the question alone.

Signs of TRANSFER:
- The student shows self-directed reasoning: it reconsiders, self-checks, backtracks, or tries and discards steps ("wait, let me re-check ...").
- It reaches the answer by a different route, decomposition, notation, or order.
- It re-derives steps in its own framing rather than restating the teacher.

When signs conflict, incidental overlap decides: a token "let me check" does not make it transfer if the student still reproduces the teacher's incidental choices.

Do NOT count as memorization:
- A matching final answer.
- Overlap forced by the problem: if the question admits essentially one canonical method, similar steps are expected -- judge the incidental choices, not the forced ones.
- Shared standard terminology or formulas.

If, after applying the above, you are still genuinely uncertain, output "memorization" (the conservative call).

## Question
{{ question }}

## Teacher Correct Response
{{ teacher_correct_response }}

## Student Response
{{ student_response }}

Output ONLY a valid JSON object with exactly this format (no prose, no code fences, no trailing commentary): {"verdict": "transfer" or "memorization"}"""

# The paper's hint prompt figure (Hint baseline): the generator reads only the solved teacher response.
HINT_TEMPLATE = """Read the solved response below and write a concise hint that helps solve the original question. Do NOT reveal the final answer, do NOT include any \\boxed{} expression, and do NOT copy the full solution. Keep only high-level guidance or the key intermediate idea.

<response>
{{ response }}
</response>"""

# The paper's correction prompt figure (Correction-SFT baseline).
CORRECTION_TEMPLATE = """Below is a question and a student's incorrect attempt. Identify the first step that is wrong, state briefly why it is wrong, then write a complete corrected solution from that point onward. Do not restate the incorrect attempt. End with the final answer in \\boxed{} format.

<question>
{{ question }}
</question>

<incorrect_attempt>
{{ incorrect_attempt }}
</incorrect_attempt>"""

# The paper's reflection prompt figure (Error-reflection-SFT baseline).
REFLECTION_TEMPLATE = """Below is a question, your own draft solution, and several incorrect attempts by a weaker student. Revise your draft so that it makes explicit the reasoning the student is missing: expand the steps the attempts get wrong, and keep the rest concise. Output only the revised solution, and end it with the final answer in \\boxed{} format.

<question>
{{ question }}
</question>

<your_draft>
{{ draft }}
</your_draft>

<student_attempts>
{{ student_attempts }}
</student_attempts>"""

# The paper's Correction-SFT algorithm: the polarity tag of a Correction-SFT instance, placed before the closer
# (the corrected response trains under <correct>, the wrong one under <incorrect>; evaluation keeps <correct>).
CORRECT_TAG = "<correct>"
INCORRECT_TAG = "<incorrect>"

_FIELD = re.compile(r"\{\{ (\w+) \}\}")


def fill(template: str, **fields: str) -> str:
    """Fill every ``{{ name }}`` field of ``template`` in a single pass.

    Raises ``KeyError`` naming a field the template needs but was not given, and
    ``ValueError`` for a given field the template does not have (a typo would otherwise
    silently drop text from the prompt).
    """
    needed = set(_FIELD.findall(template))
    unknown = set(fields) - needed
    if unknown:
        raise ValueError(f"template has no field(s) {sorted(unknown)}; it has {sorted(needed)}")

    def substitute(match: re.Match) -> str:
        name = match.group(1)
        if name not in fields:
            raise KeyError(f"template field {name!r} was not given")
        return str(fields[name])

    return _FIELD.sub(substitute, template)


def candidate_blocks(candidates: Iterable[str]) -> str:
    """One ``<candidate>`` block per text, in the given order, separated by newlines."""
    blocks = [f"<candidate>\n{text.strip()}\n</candidate>" for text in candidates]
    if not blocks:
        raise ValueError("a reformulated prompt needs at least one candidate")
    return "\n".join(blocks)


def bcq_block(candidates: Sequence[str]) -> str:
    """The BCQ augmentation block: the instruction, then one ``<candidate>`` block per text.

    ``candidates`` are the compressed texts in their (already shuffled) prompt order;
    nothing in the block says which one the teacher wrote.
    """
    return f"{BCQ_INSTRUCTION}\n{candidate_blocks(candidates)}"


def distinct_answers(answers: Iterable[str]) -> list[str]:
    """Stripped answers, each once, in first-seen order (empty answers dropped)."""
    seen: dict[str, None] = {}
    for answer in answers:
        answer = answer.strip()
        if answer:
            seen.setdefault(answer, None)
    return list(seen)


def ncq_block(wrong_answers: Iterable[str], candidates: Sequence[str]) -> str:
    """The NCQ augmentation block.

    Lists each distinct wrong answer once (first-seen order, stripped, as ``\\boxed{a}``,
    joined with ", "), then one ``<candidate>`` block per compressed wrong rollout.
    """
    answers = distinct_answers(wrong_answers)
    if not answers:
        raise ValueError("an NCQ block needs at least one parsed wrong answer")
    listed = ", ".join(f"\\boxed{{{a}}}" for a in answers)
    return f"{fill(NCQ_INSTRUCTION, answers=listed)}\n{candidate_blocks(candidates)}"


def hint_block(hint: str) -> str:
    """The Hint baseline's block (the paper's Hint algorithm): ``<hint>`` h ``</hint>``, placed before the closer."""
    if not hint.strip():
        raise ValueError("a hint block needs a non-empty hint")
    return f"<hint>\n{hint.strip()}\n</hint>"


def compose_prompt(question: str, block: str | None = None, closer: str | None = RL_CLOSER) -> str:
    """The student's prompt text: question, then the augmentation block, then the closer last.

    Parts are separated by blank lines; an empty ``block`` or ``closer`` is left out
    (``closer=None`` gives a closer-free prompt, e.g. for datasets that carry their own).
    """
    parts = [question.strip()]
    if block:
        parts.append(block.strip())
    if closer:
        parts.append(closer.strip())
    return "\n\n".join(parts)


def render_compression(response: str) -> str:
    """The compression request for one candidate response."""
    return fill(COMPRESSION_TEMPLATE, response=response.strip())


def render_judge(
    question: str, model_response: str, ground_truth: str, options: str | Sequence[str] | Mapping | None = None
) -> str:
    """The shared judge prompt; the options section appears only when options are non-empty.

    ``options`` may be a string, a list (one option a line) or a mapping (``"A. text"`` lines).
    """
    if isinstance(options, Mapping):
        options = "\n".join(f"{label}. {text}" for label, text in options.items())
    elif options is not None and not isinstance(options, str):
        options = "\n".join(str(option) for option in options)
    options = (options or "").strip()
    template = JUDGE_TEMPLATE if options else JUDGE_TEMPLATE.replace(_JUDGE_OPTIONS_SECTION, "")
    fields = dict(
        question=question.strip(), model_response=model_response.strip(), ground_truth=str(ground_truth).strip()
    )
    if options:
        fields["options"] = options
    return fill(template, **fields)


def render_memorization_judge(question: str, teacher_correct_response: str, student_response: str) -> str:
    """The trace-overlap judge prompt for one student rollout against its question's fixed teacher reference."""
    return fill(
        MEMORIZATION_JUDGE_TEMPLATE,
        question=question.strip(),
        teacher_correct_response=teacher_correct_response.strip(),
        student_response=student_response.strip(),
    )


def render_hint(response: str) -> str:
    """The Hint baseline's request to turn one solved teacher response into a hint."""
    return fill(HINT_TEMPLATE, response=response.strip())


def render_correction(question: str, incorrect_attempt: str) -> str:
    """The Correction-SFT baseline's request to correct one wrong student attempt."""
    return fill(CORRECTION_TEMPLATE, question=question.strip(), incorrect_attempt=incorrect_attempt.strip())


def render_reflection(question: str, draft: str, student_attempts: Sequence[str]) -> str:
    """The Error-reflection-SFT baseline's request to revise a teacher draft given wrong attempts."""
    if not student_attempts:
        raise ValueError("render_reflection needs at least one student attempt")
    attempts = "\n\n".join(a.strip() for a in student_attempts)
    return fill(REFLECTION_TEMPLATE, question=question.strip(), draft=draft.strip(), student_attempts=attempts)
