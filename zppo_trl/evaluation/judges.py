"""The BenchJudge scoring path: each benchmark's own judge prompt, run on the shared judge checkpoint.

Source of truth: the paper's "Benchmark-specific judge prompts" paragraph
(`sec:appendix:benchmarks`) and its figures ``fig:prompt-judge-mmvet``,
``fig:prompt-judge-multich``, ``fig:prompt-judge-mmvu``, ``fig:prompt-judge-hle``,
``fig:prompt-judge-charxiv-r`` and ``fig:prompt-judge-charxiv-d``. Five settings of the suite
(``TaskSpec.scoring == "benchjudge"``) are scored this way: CharXiv, MM-Vet, HLE, MultiCh, MMVU.
The judge is the shared checkpoint at `tasks.JUDGE_DECODING` (temperature 0, 512 tokens); one
call per item, no retries.

What is verbatim and what is reconstructed. The paper's figures "give the executed instruction
text and runtime fields"; every template constant below is that text, with LaTeX rendered as
plain text (ASCII quotes for LaTeX quote ligatures, ``∈`` and ``–`` where the figure typesets
them). The paper shortens two static blocks "for space": the rest of MM-Vet's few-shot table and
the per-category CharXiv rubric bodies. Those are reconstructed from the upstream evaluators and
marked ``RECONSTRUCTED`` where they are defined, with the upstream file and commit. Line breaks
are not recoverable from a typeset figure; where the figure does not show them they follow the
upstream evaluator.

Each template has a ``render_*`` building the prompt from a dataset row (column names from
`tasks.SUITE`) and a ``parse_*`` reading the judge's reply into a `JudgeScore`. Parsers never
raise: a reply they cannot read scores 0 with ``parsed=False``. A row missing a field the
prompt needs raises ValueError naming it. `render_bench_judge` / `score_bench_judge` dispatch
on the setting name.

Pure: no TRL, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..prompts import fill
from ..teacher import parse_verdict
from .tasks import SUITE

__all__ = [
    "MMVET_TEMPLATE",
    "MULTICH_TEMPLATE",
    "MMVU_TEMPLATE",
    "HLE_TEMPLATE",
    "CHARXIV_REASONING_TEMPLATE",
    "CHARXIV_DESCRIPTIVE_TEMPLATE",
    "CHARXIV_REASONING_RULES",
    "CHARXIV_DESCRIPTIVE_RUBRICS",
    "CHARXIV_DESCRIPTIVE_QUESTIONS",
    "CHARXIV_RUBRIC_CLASS",
    "BENCH_JUDGE_SETTINGS",
    "JudgeScore",
    "render_mmvet",
    "render_multich",
    "render_mmvu",
    "render_hle",
    "render_charxiv_reasoning",
    "render_charxiv_descriptive",
    "parse_mmvet",
    "parse_multich",
    "parse_mmvu",
    "parse_hle",
    "parse_charxiv",
    "render_bench_judge",
    "score_bench_judge",
]


@dataclass(frozen=True)
class JudgeScore:
    """One judge reply read by its benchmark's rule.

    Attributes:
        score: in [0, 1]; graded for MM-Vet, 0 or 1 elsewhere; 0 whenever ``parsed`` is False.
        parsed: whether the reply had the benchmark's format (False: flagged, scored 0).
        extracted: the judge's extracted final answer where the format has one (HLE, CharXiv),
            or the verdict token it gave (MultiChallenge ``YES``/``NO``); None otherwise.
    """

    score: float
    parsed: bool
    extracted: str | None = None


_UNPARSED = JudgeScore(0.0, False)


# --------------------------------------------------------------------------------------------
# MM-Vet (fig:prompt-judge-mmvet)
# --------------------------------------------------------------------------------------------
# VERBATIM from the paper: the instruction paragraph, the table header, the exemplar rows
# "x = 3 | 0.0", "x = -1 | 0.5", "x = -1 or x = -5 | 1.0", and the query row.
# RECONSTRUCTED (the figure's "... remaining fixed MM-Vet exemplars"): the rows "x = -5 | 0.5",
# "x = -5 or 5 | 0.5" and the two "Can you explain this meme?" rows, and the row order, from
# yuweihao/MM-Vet mm-vet_evaluator.py (commit c7ff270d86fb79c42346214366f4192c0e08b042, the
# module-level `prompt`). The blank line before the query row and the query row's trailing
# " | " also follow that evaluator, which sends ``prompt + "\n" + " | ".join([q, gt, pred, ""])``.
MMVET_TEMPLATE = """Compare the ground truth and prediction from AI models, to give a correctness score for the prediction. <AND> in the ground truth means it is totally right only when all elements in the ground truth are present in the prediction, and <OR> means it is totally right when any one element in the ground truth is present in the prediction. The correctness score is 0.0 (totally wrong), 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, or 1.0 (totally right). Just complete the last space of the correctness score.

Question | Ground truth | Prediction | Correctness
--- | --- | --- | ---
What is x in the equation? | -1 <AND> -5 | x = 3 | 0.0
What is x in the equation? | -1 <AND> -5 | x = -1 | 0.5
What is x in the equation? | -1 <AND> -5 | x = -5 | 0.5
What is x in the equation? | -1 <AND> -5 | x = -5 or 5 | 0.5
What is x in the equation? | -1 <AND> -5 | x = -1 or x = -5 | 1.0
Can you explain this meme? | This meme is poking fun at the fact that the names of the countries Iceland and Greenland are misleading. Despite its name, Iceland is known for its beautiful green landscapes, while Greenland is mostly covered in ice and snow. The meme is saying that the person has trust issues because the names of these countries do not accurately represent their landscapes. | The meme talks about Iceland and Greenland. It's pointing out that despite their names, Iceland is not very icy and Greenland isn't very green. | 0.4
Can you explain this meme? | This meme is poking fun at the fact that the names of the countries Iceland and Greenland are misleading. Despite its name, Iceland is known for its beautiful green landscapes, while Greenland is mostly covered in ice and snow. The meme is saying that the person has trust issues because the names of these countries do not accurately represent their landscapes. | The meme is using humor to point out the misleading nature of Iceland's and Greenland's names. Iceland, despite its name, has lush green landscapes while Greenland is mostly covered in ice and snow. The text 'This is why I have trust issues' is a playful way to suggest that these contradictions can lead to distrust or confusion. The humor in this meme is derived from the unexpected contrast between the names of the countries and their actual physical characteristics. | 1.0

{{ question }} | {{ ground_truth }} | {{ prediction }} | """

# --------------------------------------------------------------------------------------------
# MultiChallenge (fig:prompt-judge-multich)
# --------------------------------------------------------------------------------------------
# VERBATIM from the paper (all text and fields). Line breaks from the upstream verifier,
# ekwinox117/multi-challenge src/evaluator.py `JUDGE_PROMPT` (commit
# 5ccefcca6a39020d66c1383c4e6a809cb07afa33), whose text the figure reproduces word for word.
MULTICH_TEMPLATE = """You are tasked with evaluating a model response to see if it meets a specific criteria.
The criteria will always be YES/NO evaluation.

The model response is as follows:
<MODEL_RESPONSE>
{{ response }}
</MODEL_RESPONSE>

The criteria that the model response must meet is as follows. Be VERY STRICT!:
<CRITERIA>
{{ target_question }}
</CRITERIA>

Print your reasoning followed by your verdict, either "YES" or "NO"."""

# --------------------------------------------------------------------------------------------
# MMVU (fig:prompt-judge-mmvu)
# --------------------------------------------------------------------------------------------
# VERBATIM from the paper. The figure is one template with two branch-only parts, marked
# "(Open-ended branch only)" and "(MCQ only)" (annotations, not prompt text): the open-ended
# paragraph and the options section; `render_mmvu` drops the part that does not apply, as
# upstream (yale-nlp/MMVU utils/eval_utils.py, commit f5bc479081726208704965536374833df08ab701)
# switches between OPEN_ENDED_INSTRUCTION and MULTI_CHOICE_INSTRUCTION on `question_type`. The
# output line is the shared judge's (the paper replaces upstream's extracted_answer/correct
# structure), so the reply is read by the shared strict parser. Headings are followed by a line
# break as in the shared judge template (the figure sets them inline).
_MMVU_OPEN_ENDED_PARAGRAPH = (
    "The final answer generated by the model does not need to match the ground-truth answer word-for-word. "
    "However, it should ONLY be considered correct if it demonstrates the exact same technique or concept "
    "explicitly and unambiguously equivalent to the ground-truth answer.\n\n"
)
_MMVU_OPTIONS_SECTION = "## Options\n{{ options }}\n\n"
MMVU_TEMPLATE = (
    "Evaluate whether the model's final answer is correct by comparing it to the ground-truth answer provided "
    "for the given question. You should first extract the final answer from the model's response, and then "
    "compare the extracted answer with the ground-truth answer to determine its accuracy.\n\n"
    + _MMVU_OPEN_ENDED_PARAGRAPH
    + "## Question\n{{ question }}\n\n"
    + _MMVU_OPTIONS_SECTION
    + "## Ground Truth Answer\n{{ ground_truth }}\n\n"
    "## Model's Full Response\n{{ model_response }}\n\n"
    'Output ONLY a valid JSON object with exactly this format (no prose, no code fences, no trailing '
    'commentary): {"verdict": "correct" or "wrong"}'
)

# --------------------------------------------------------------------------------------------
# HLE (fig:prompt-judge-hle)
# --------------------------------------------------------------------------------------------
# VERBATIM from the paper. It is not upstream's text word for word: the paper's figure shortens
# the `reasoning` and `correct` criteria and adds the closing JSON instruction (upstream,
# centerforaisafety/hle hle_eval/run_judge_results.py `JUDGE_PROMPT`, read from the fork
# kflu/hle at commit 0572f38efad8fcc9fdb881092fb95d78bd18f12f, gets the four fields through an
# OpenAI structured-output schema instead). The paper says the figures give the executed text,
# so the figure wins. Paragraph breaks follow upstream.
HLE_TEMPLATE = """Judge whether the following [response] to [question] is correct or not based on the precise and unambiguous [correct_answer] below.

[question]: {{ question }}

[response]: {{ response }}

Your judgement must be in the format and criteria specified below:

extracted_final_answer: The final exact answer extracted from the [response]. Put the extracted answer as 'None' if there is no exact, final answer to extract from the response.

[correct_answer]: {{ correct_answer }}

reasoning: Explain why the extracted answer is correct or incorrect based on [correct_answer], focusing only on whether there are meaningful differences. Do not solve the problem, do not argue for any answer different than [correct_answer], focus only on whether the answers match.

correct: Answer 'yes' if extracted_final_answer matches [correct_answer] (or is within a small margin of error for numerical problems), 'no' otherwise.

confidence: Confidence score ∈ [0%,100%] extracted from [response] (default 100).

Respond with ONLY a single JSON object using exactly these keys: extracted_final_answer, reasoning, correct ("yes"/"no"), confidence (integer 0–100)."""

# --------------------------------------------------------------------------------------------
# CharXiv (fig:prompt-judge-charxiv-r, fig:prompt-judge-charxiv-d)
# --------------------------------------------------------------------------------------------
# The two wrappers are VERBATIM from the paper (they are the paper's single-item rewrite of
# upstream's REASONING_GRADING_PREFIX / DESCRIPTIVE_GRADING_PREFIX, which grade up to five
# responses per call under keys extract_answer_T<i>/score_T<i>).
CHARXIV_REASONING_TEMPLATE = """You will be given a question, a ground truth answer and a model response. You need to extract the final answer from the model response, compare it with the ground truth answer, and then assign a binary score. Avoid providing explanations in your response. If there is no provided model response, please leave the extracted answer empty and give a score of 0.

Your response must follow JSON format with keys [extracted_answer, score] where score ∈ {0,1}. You must follow the scoring rules:

{{ rules }}

### Your Turn ###
* Question: {{ question }}
* Ground Truth: {{ ground_truth }}
* Response: {{ response }}

Respond with ONLY a single JSON object using exactly these keys: extracted_answer (string), score (integer 0 or 1)."""

CHARXIV_DESCRIPTIVE_TEMPLATE = """You will be given a pair of ground truth answer and model response under an overarching question. You need to extract the final answer from the model response, compare it with the ground truth answer, and then assign a binary score. Avoid providing explanations in your response. If there is no provided model response, please leave the extracted answer empty and give a score of 0. Your response must follow JSON format with keys [extracted_answer, score] where score ∈ {0,1}.

Overarching Question: {{ overarching_question }}

{{ rubric }}

### Your Turn ###
Response: {{ response }}
Ground Truth: {{ ground_truth }}

Respond with ONLY a single JSON object using exactly these keys: extracted_answer (string), score (integer 0 or 1)."""

# RECONSTRUCTED (the paper: "the per-category CharXiv rubric bodies" are shortened in the figures
# and "complete in the executed prompt"). Source: princeton-nlp/CharXiv src/constants.py (commit
# 7ebe88f78dee387691551f071abcb2b9e1a8025b; read through src/reasoning_utils.py and
# src/descriptive_utils.py).
#
# Reasoning `rules`, keyed by the row's `reasoning_a_type` (upstream `inst_category`): upstream's
# REASONING_GRADING_INST[k] up to its "### Your Turn ###" block, which the paper's wrapper
# carries itself; the uniform 4-space indentation of upstream's triple-quoted source is removed.
CHARXIV_REASONING_RULES: dict[int, str] = {
    1: """### Rules ###
* Give a score of 1 if and only if the final answer and the ground truth answer are referring to the same term. It's acceptable to have different grammar or form (e.g., α and alpha; $R^2_{t,h,v,m}$ and R^2_t,h,v,m). It's also acceptable to have different orders of the terms when question asks for multiple terms.
* Give a score of 0 if any term (e.g., ACC+ and ACC; P-101 and P=101) is different between the final answer and the ground truth.

### Example 1 Starts ###
* Question: What is the name of the curve that intersects y=\\lambda exactly three times?
* Ground Truth: P56962
* Response: There is only one curve that intersects y=\\lambda exactly three times. The name of the curve is written as P55762.

{
    "extracted_answer": "P55762",
    "score": 0
}
### Example 1 Ends ###


### Example 2 Starts ###
* Question: What is the letter of the subplot where all bars are above 35?
* Ground Truth: (b)
* Response: The letter of the subplot where all bars are above 35 is b.

{
    "extracted_answer": "b",
    "score": 1
}
### Example 2 Ends ###""",  # text-in-chart
    2: """### Rules ###
* If there are predefined options in the question:
    * Give a score of 1 if the final answer matches the ground truth answer exactly.
    * Give a score of 0 if the final answer does not match the ground truth answer.
* If there are no predefined options in the question:
    * Give a score of 1 if the final answer shares the same semantic meaning with the ground truth answer (e.g., "increasing then decreasing" and "moving up then down"; "converge" and "move closer together").
    * Give a score of 0 if the final answer shares different semantic meanings from the ground truth answer (e.g., "increasing then decreasing" and "remain constant"; "converge" and "diverge").

### Example 1 Starts ###
* Question: What is the trend of the red curve between t=10 and t=25?
* Ground Truth: increasing then decreasing
* Response: The red curve is increasing between t=10 and t=25.

{
    "extracted_answer": "increasing",
    "score": 0
}
### Example 1 Ends ###

### Example 2 Starts ###
* Question: What is the interval where the blue curve achieves the maximum value among [0, 50], [50, 100], [100, 150], and [150, 200]?
* Ground Truth: [50, 100]
* Response: The interval where the blue curve achieves the maximum value is [50, 100].

{
    "extracted_answer": "[50, 100]",
    "score": 1
}
### Example 2 Ends ###""",  # text-in-general
    3: """### Rules ###
* Give a score of 1 if and only if the two numbers are exactly equal in values. It's acceptable to have different notations (e.g., 0.01 and 10^-2; 1500 and 1.5e3).
* Give a score of 0 if the two numbers are different in values.

### Example 1 Starts ###
* Question: What is the value of the red curve at t=10?
* Ground Truth: 0.01
* Response: The value of the red curve at t=10 is 0.012.

{
    "extracted_answer": "0.012",
    "score": 0
}
### Example 1 Ends ###

### Example 2 Starts ###
* Question: What is the value of the blue curve at t=50?
* Ground Truth: 1500
* Response: The value of the blue curve at t=50 is 1.5e3.

{
    "extracted_answer": "1.5e3",
    "score": 1
}
### Example 2 Ends ###""",  # number-in-chart
}
# number-in-general: upstream's text for 4 is identical to 3's.
CHARXIV_REASONING_RULES[4] = CHARXIV_REASONING_RULES[3]

# Descriptive `rubric` bodies, keyed by the paper's seven classes: upstream's
# DESCRIPTIVE_GRADING_ICL, outer whitespace stripped, otherwise as written (their in-context
# examples keep upstream's batched T1..T3 layout and its JSON slips). One deliberate deviation:
# upstream's 'enum' body is a non-raw Python string, so its "\alpha" and "\beta" reach the judge
# as the control characters BEL and BS; this keeps the source's visible text "\alpha, \beta".
CHARXIV_DESCRIPTIVE_RUBRICS: dict[str, str] = {
    'title': """Rubric: 
    * Give a score of 1 if and only if the extracted answer and the ground truth answer are referring to the same term. It's acceptable to have different grammar or form (e.g., α and alpha; $R^2_{t,h,v,m}$ and R^2_t,h,v,m). It's acceptable to omit letter prefixes (e.g., (a) Increment over time and Increment over time).
    * Give a score of 0 if any term in the extracted answer is different from the ground truth answer.
    * When ground truth answer is "Not Applicable", the response must express "Not Applicable" to receive a score of 1.

    ### Example Start ###
    T1:
    Response 1: The title of the plot is "The number of students in each grade".
    Ground Truth 1: The variance of students in each grade

    T2:
    Response 2: There is no title.
    Ground Truth 2: Not Applicable

    T3:
    Response 3: A_v^t
    Ground Truth 3: A^t_v

    {
        "extract_answer_T1": "The number of students in each grade",
        "score_T1": 0
        "extract_answer_T2: "Not Applicable",
        "score_T2": 1
        "extract_answer_T3": "A_v^t",
        "score_T3": 1
    }
    ### Example End ###""",
    'ocr': """Rubric: 
    * Give a score of 1 if and only if the extracted answer and the ground truth answer are referring to the same term. It's acceptable to have equivalent grammar or form (e.g., α and alpha; $R^2_{t,h,v,m}$ and R^2_t,h,v,m). If the ground truth is a number, the extracted answer should be the number with the exact same value.
    * Give a score of 0 if any term in the extracted answer is different from the ground truth answer, or if the extracted number is different in value from the ground truth number.
    * When ground truth answer is "Not Applicable", the response must express "Not Applicable" to receive a score of 1.

    ### Example Start ###
    T1:
    Response 1: The answer is 1.0
    Ground Truth 1: 1.00

    T2:
    Response 2: By manually inspecting the plot, the final answer should be 0.
    Ground Truth 2: Not Applicable

    T3:
    Response 3: A_v^t
    Ground Truth 3: A^t_v

    {
        "extract_answer_T1": 1.0,
        "score_T1": 1
        "extract_answer_T2: 0,
        "score_T2": 0
        "extract_answer_T3": "A_v^t",
        "score_T3": 1
    }
    ### Example End ###""",
    'quant': """Rubric:
    * Give a score of 1 if and only if the extracted answer and the ground truth answer are numbers with the exact same value.
    * Give a score of 0 if the extracted answer is different in value from the ground truth answer.
    * When ground truth answer is "Not Applicable", the response must express "Not Applicable" to receive a score of 1.

    ### Example Start ###
    T1:
    Response 1: 5
    Ground Truth 1: 6

    T2:
    Response 2: 0
    Ground Truth 2: Not Applicable

    T3:
    Response 3: 4
    Ground Truth 3: 4

    {
        "extract_answer_T1": 5,
        "score_T1": 0
        "extract_answer_T2: 0,
        "score_T2": 0
        "extract_answer_T3": 4,
        "score_T3": 1
    }
    ### Example End ###""",
    'bool': """Rubric:
    * Give a score of 1 if and only if the extracted answer and the ground truth answer are the same.
    * Give a score of 0 if the extracted answer and the ground truth answer are different.
    * When ground truth answer is "Not Applicable", the response must express "Not Applicable" to receive a score of 1.

    ### Example Start ###
    T1:
    Response 1: No, there are no intersections.
    Ground Truth 1: no

    T2:
    Response 2: No, all the lines are parallel.
    Ground Truth 2: Yes

    T3:
    Response 3: There are no lines in the plot.
    Ground Truth 3: Not Applicable

    {
        "extract_answer_T1": "No",
        "score_T1": 1
        "extract_answer_T2: "No",
        "score_T2": 0
        "extract_answer_T3": "Not Applicable",
        "score_T3": 1
    }
    ### Example End ###""",
    'enum': """Rubric:
    * Give a score of 1 if and only if the extracted answer and the ground truth answer are referring to the same term. It's acceptable to have equivalent grammar or form (e.g., α and alpha; $R^2_{t,h,v,m}$ and R^2_t,h,v,m). The order of the terms must be the same.
    * Give a score of 0 if any term in the extracted answer is different from the ground truth answer, or if the order of the terms is different.
    * When ground truth answer is "Not Applicable", the response must express "Not Applicable" to receive a score of 1.

    ### Example Start ###
    T1:
    Response 1: Here are the names of the labels: A, B, C
    Ground Truth 1: B, A, C

    T2:
    Response 2: The labels are T56, B33.
    Ground Truth 2: T56,B33,A12

    T3:
    Response 3: \\alpha, \\beta, \\gamma^t_v
    Ground Truth 3: α, β, γ_v^t

    {
        "extract_answer_T1": "A, B, C",
        "score_T1": 0
        "extract_answer_T2: "T56, B33",
        "score_T2": 0
        "extract_answer_T3": "\\alpha, \\beta, \\gamma^t_v",
        "score_T3": 1
    }
    ### Example End ###""",
    'trend': """Rubric:
    * Give a score of 1 if and only if the extracted answer and the ground truth answer share the same general trend.
    * Give a score of 0 if the extracted answer and the ground truth answer are different in trend expression.

    ### Example Start ###
    T1:
    Response 1: there is an increase in the data from left to right
    Ground Truth 1: Decreases

    T2:
    Response 2: the curves move up and stay constant
    Ground Truth 2: Increases then stabilizes

    T3:
    Response 3: Decreases
    Ground Truth 3: Decreases then increases

    {
        "extract_answer_T1": "Increases",
        "score_T1": 0
        "extract_answer_T2: "Move up and stay constant",
        "score_T2": 1
        "extract_answer_T3": "Decreases",
        "score_T3": 0
    }
    ### Example End ###""",
    'layout': """Rubric:
    * Give a score of 1 if and only if the extracted answer and the ground truth answer are the same in terms of the number of rows and columns (e.g., n by m).
    * Give a score of 0 if the extracted answer is different from the ground truth answer.

    ### Example Start ###
    T1:
    Response 1: 2 by 3
    Ground Truth 1: 3 by 2

    T2:
    Response 2: the layout is 1 by 1
    Ground Truth 2: 1 by 1

    T3:
    Response 3: there are two rows and three columns
    Ground Truth 3: 2 by 3

    {
        "extract_answer_T1": "2 by 3",
        "score_T1": 0
        "extract_answer_T2: "1 by 1",
        "score_T2": 1
        "extract_answer_T3": "2 by 3",
        "score_T3": 1
    }
    ### Example End ###""",
}
# RECONSTRUCTED: the `overarching_question` per descriptive template id (the row's
# descriptive_q<i>), upstream's DESCRIPTIVE_GRADING_QMAP (same file and commit).
CHARXIV_DESCRIPTIVE_QUESTIONS: dict[int, str] = {
    1: 'What is the title of the plot?',
    2: 'What is the label of the x-axis?',
    3: 'What is the label of the y-axis?',
    4: 'What is the leftmost labeled tick on the x-axis?',
    5: 'What is the rightmost labeled tick on the x-axis?',
    6: 'What is the spatially lowest labeled tick on the y-axis?',
    7: 'What is the spatially highest labeled tick on the y-axis?',
    8: 'What is difference between consecutive numerical tick values on the x-axis?',
    9: 'What is difference between consecutive numerical tick values on the y-axis?',
    10: 'How many lines are there?',
    11: 'Do any lines intersect?',
    12: 'How many discrete labels are there in the legend?',
    13: 'What are the names of the labels in the legend? (from top to bottom, then left to right)',
    14: 'What is the difference between the maximum and minimum values of the tick labels on the continuous legend (i.e., colorbar)?',
    15: 'What is the maximum value of the tick labels on the continuous legend (i.e., colorbar)?',
    16: 'What is the general trend of data from left to right?',
    17: 'What is the total number of explicitly labeled ticks across all axes?',
    18: 'What is the layout of the subplots?',
    19: 'What is the number of subplots?',
}

# RECONSTRUCTED: descriptive template id -> rubric class, upstream's get_rubric
# (src/descriptive_utils.py, same commit).
CHARXIV_RUBRIC_CLASS: dict[int, str] = {
    1: "title",
    **dict.fromkeys((2, 3, 4, 5, 6, 7), "ocr"),
    **dict.fromkeys((8, 9, 10, 12, 14, 15, 17, 19), "quant"),
    11: "bool",
    13: "enum",
    16: "trend",
    18: "layout",
}

BENCH_JUDGE_SETTINGS = ("CharXiv", "MM-Vet", "HLE", "MultiCh", "MMVU")
"""The settings scored by their benchmark's own judge prompt, as named in `tasks.SUITE`."""

# Columns the prompts need beyond the TaskSpec's question/answer/options fields (upstream
# schemas). CharXiv's `reasoning_a_type` (1..4, upstream `inst_category`) picks the rules body.
_CHARXIV_REASONING_TYPE = "reasoning_a_type"
_MULTICH_CRITERION = "target_question"
_MMVU_TYPE = "question_type"
_MMVU_TYPES = ("multiple-choice", "open-ended")


def _field(row: Mapping[str, Any], name: str) -> Any:
    """``row[name]``; a missing or None value raises ValueError naming the field."""
    value = row.get(name) if isinstance(row, Mapping) else None
    if value is None:
        raise ValueError(f"judge prompt needs the row field {name!r}, which is missing")
    return value


def _text(row: Mapping[str, Any], name: str) -> str:
    return str(_field(row, name)).strip()


def _response(response: str | None) -> str:
    # A failed generation (None) is an empty response; CharXiv's rubric scores that 0 itself.
    return "" if response is None else str(response).strip()


def render_mmvet(row: Mapping[str, Any], response: str | None) -> str:
    """MM-Vet's judge prompt for one row; ``<AND>``/``<OR>`` are spaced out as upstream does."""
    spec = SUITE["MM-Vet"]
    answer = _text(row, spec.answer_field).replace("<AND>", " <AND> ").replace("<OR>", " <OR> ")
    return fill(MMVET_TEMPLATE, question=_text(row, spec.question_field), ground_truth=answer, prediction=_response(response))


def render_multich(row: Mapping[str, Any], response: str | None) -> str:
    """MultiChallenge's YES/NO verifier prompt; the judge sees the response and the criterion only."""
    return fill(MULTICH_TEMPLATE, response=_response(response), target_question=_text(row, _MULTICH_CRITERION))


def _mmvu_options(choices: Any) -> str:
    # upstream: one "key: value" line per choice, in the dataset's order
    if isinstance(choices, Mapping):
        lines = [f"{key}: {value}" for key, value in choices.items()]
    elif isinstance(choices, (list, tuple)):
        lines = [f"{chr(ord('A') + i)}: {value}" for i, value in enumerate(choices)]
    else:
        lines = []
    return "\n".join(lines)


def render_mmvu(row: Mapping[str, Any], response: str | None) -> str:
    """MMVU's two-mode judge prompt: the options section for ``multiple-choice`` rows, the
    equivalence paragraph for ``open-ended`` rows (the row's ``question_type``)."""
    spec = SUITE["MMVU"]
    kind = _text(row, _MMVU_TYPE)
    if kind not in _MMVU_TYPES:
        raise ValueError(f"row field {_MMVU_TYPE!r} is {kind!r}, not one of {_MMVU_TYPES}")
    fields = dict(
        question=_text(row, spec.question_field),
        ground_truth=_text(row, spec.answer_field),
        model_response=_response(response),
    )
    if kind == "multiple-choice":
        options = _mmvu_options(_field(row, spec.options_field))
        if not options:
            raise ValueError(f"judge prompt needs the row field {spec.options_field!r}, which is empty")
        template = MMVU_TEMPLATE.replace(_MMVU_OPEN_ENDED_PARAGRAPH, "")
        fields["options"] = options
    else:
        template = MMVU_TEMPLATE.replace(_MMVU_OPTIONS_SECTION, "")
    return fill(template, **fields)


def render_hle(row: Mapping[str, Any], response: str | None) -> str:
    """HLE's judge prompt; the judge reads the full response (the paper)."""
    spec = SUITE["HLE"]
    return fill(
        HLE_TEMPLATE, question=_text(row, spec.question_field), response=_response(response),
        correct_answer=_text(row, spec.answer_field),
    )  # fmt: skip


def render_charxiv_reasoning(row: Mapping[str, Any], response: str | None) -> str:
    """CharXiv's Reasoning judge prompt, with the rules body of the row's answer type (1..4)."""
    spec = SUITE["CharXiv"]
    kind = _field(row, _CHARXIV_REASONING_TYPE)
    try:
        rules = CHARXIV_REASONING_RULES[int(kind)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"row field {_CHARXIV_REASONING_TYPE!r} is {kind!r}, not one of 1..4") from None
    return fill(
        CHARXIV_REASONING_TEMPLATE, rules=rules, question=_text(row, spec.question_field),
        ground_truth=_text(row, spec.answer_field), response=_response(response),
    )  # fmt: skip


def render_charxiv_descriptive(row: Mapping[str, Any], response: str | None, index: int) -> str:
    """CharXiv's Descriptive judge prompt for the row's ``index``-th (1..4) descriptive question.

    ``descriptive_q<index>`` holds the template id (1..19) that picks the overarching question
    and the rubric class; ``descriptive_a<index>`` the ground truth.
    """
    if index not in (1, 2, 3, 4):
        raise ValueError(f"CharXiv has descriptive questions 1..4, not {index!r}")
    name = f"descriptive_q{index}"
    qid = _field(row, name)
    try:
        qid = int(qid)
        question, rubric = CHARXIV_DESCRIPTIVE_QUESTIONS[qid], CHARXIV_DESCRIPTIVE_RUBRICS[CHARXIV_RUBRIC_CLASS[qid]]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"row field {name!r} is {qid!r}, not a descriptive template id 1..19") from None
    return fill(
        CHARXIV_DESCRIPTIVE_TEMPLATE, overarching_question=question, rubric=rubric,
        response=_response(response), ground_truth=_text(row, f"descriptive_a{index}"),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Parsers
# --------------------------------------------------------------------------------------------
class _Duplicate(ValueError):
    pass


def _strict_object(reply: Any) -> dict | None:
    """The reply as a JSON object, or None.

    The whole reply must be one JSON object (JSON's own whitespace around and inside it, nothing
    else: no code fences, no prose); duplicate keys are rejected. This is what upstream reads
    where it asks the API for JSON (CharXiv's json_object mode, HLE's structured output).
    """
    if not isinstance(reply, str):
        return None

    def pairs(items: list[tuple[str, Any]]) -> dict:
        keys = [key for key, _ in items]
        if len(set(keys)) != len(keys):
            raise _Duplicate
        return dict(items)

    try:
        value = json.loads(reply, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # _Duplicate is a ValueError
        return None
    return value if isinstance(value, dict) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The first token: a plain decimal (upstream float()s it; this refuses what float() would also
# take but a grade never is: "nan", "inf", "1e-1", "1_0", signs).
_MMVET_GRADE = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def parse_mmvet(reply: str | None) -> JudgeScore:
    """MM-Vet's graded reading: the reply's first token is a float in [0, 1], which is the score.

    As upstream (``float(content.split(" ")[0].strip())`` in [0, 1]), text after the first token
    is ignored; leading whitespace and a newline after the grade are tolerated. Upstream re-asks
    up to five times on a bad reply; here one call is made and a bad reply scores 0, flagged.
    """
    if not isinstance(reply, str):
        return _UNPARSED
    tokens = reply.split()
    if not tokens or not _MMVET_GRADE.fullmatch(tokens[0]):
        return _UNPARSED
    grade = float(tokens[0])
    if not (math.isfinite(grade) and 0.0 <= grade <= 1.0):
        return _UNPARSED
    return JudgeScore(grade, True)


_VERDICT_WORD = re.compile(r"\b(YES|NO)\b")
_FINAL_VERDICT = re.compile(r"\b(YES|NO)$")
# Markdown emphasis, quotes and closing punctuation a verdict may be wrapped in at the very end.
_TRAILING_DECORATION = " \t*_`'\".!)]"


def _multich_verdict(reply: Any) -> str | None:
    if not isinstance(reply, str):
        return None
    value = _strict_object(reply)
    if value is not None:  # upstream's structured form: {"reasoning": str, "verdict": "YES" | "NO"}
        if set(value) == {"reasoning", "verdict"} and isinstance(value["reasoning"], str):
            return value["verdict"] if value["verdict"] in ("YES", "NO") else None
        return None
    lines = [line for line in reply.splitlines() if line.strip()]
    if not lines:
        return None
    last = lines[-1].rstrip(_TRAILING_DECORATION)
    final = _FINAL_VERDICT.search(last)
    if final is None or len(set(_VERDICT_WORD.findall(last))) != 1:
        return None  # no verdict, one not at the end, or both ("either YES or NO")
    return final.group(1)


def parse_multich(reply: str | None, pass_criteria: str) -> JudgeScore:
    """MultiChallenge's reading: the judge's verdict, passed when it equals the row's pass criteria.

    The prompt asks for reasoning followed by the verdict, so the verdict is the last word of
    the reply's last non-blank line: ``YES`` or ``NO`` in capitals (upstream's
    ``Literal["YES", "NO"]``), optionally wrapped in markdown emphasis, quotes or a final period;
    that line must not name the other verdict too. A reply that is upstream's structured JSON
    (exactly ``reasoning`` and ``verdict``) is read from its ``verdict``. Score: 1 when the verdict
    equals ``pass_criteria`` (upstream: ``verdict == pass_criteria``), else 0.
    """
    criteria = str(pass_criteria).strip()
    if criteria not in ("YES", "NO"):
        raise ValueError(f"pass_criteria must be 'YES' or 'NO', not {pass_criteria!r}")
    verdict = _multich_verdict(reply)
    if verdict is None:
        return _UNPARSED
    return JudgeScore(float(verdict == criteria), True, verdict)


def parse_mmvu(reply: str | None) -> JudgeScore:
    """MMVU's reading under the paper's template: the shared judge's strict verdict parser."""
    verdict = parse_verdict(reply)
    return _UNPARSED if verdict is None else JudgeScore(float(verdict), True)


_HLE_KEYS = {"extracted_final_answer", "reasoning", "correct", "confidence"}


def parse_hle(reply: str | None) -> JudgeScore:
    """HLE's reading: one JSON object with exactly the four keys of the prompt, typed as upstream's
    schema (``extracted_final_answer``/``reasoning`` strings, ``correct`` ``"yes"``/``"no"``,
    ``confidence`` an integer, here also bounded to 0..100 as the prompt asks); 1 on ``"yes"``."""
    value = _strict_object(reply)
    if value is None or set(value) != _HLE_KEYS:
        return _UNPARSED
    answer, reasoning, correct, confidence = (value[key] for key in ("extracted_final_answer", "reasoning", "correct", "confidence"))
    if not (isinstance(answer, str) and isinstance(reasoning, str) and correct in ("yes", "no")):
        return _UNPARSED
    if not (_is_int(confidence) and 0 <= confidence <= 100):
        return _UNPARSED
    return JudgeScore(float(correct == "yes"), True, answer)


def parse_charxiv(reply: str | None) -> JudgeScore:
    """CharXiv's reading (both wrappers): one JSON object with exactly ``extracted_answer`` and
    ``score``; ``score`` the integer 0 or 1 (upstream counts any other score as invalid, scored
    0); ``extracted_answer`` a string or a number (upstream's own in-context examples extract
    numbers, and upstream does not check it)."""
    value = _strict_object(reply)
    if value is None or set(value) != {"extracted_answer", "score"}:
        return _UNPARSED
    answer, score = value["extracted_answer"], value["score"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        return _UNPARSED
    if not (_is_int(score) and score in (0, 1)):
        return _UNPARSED
    return JudgeScore(float(score), True, str(answer))


# --------------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------------
def _charxiv_part(part: str | int | None) -> str | int:
    if part == "reasoning" or part in (1, 2, 3, 4):
        return part
    raise ValueError(f"CharXiv needs part='reasoning' or a descriptive question index 1..4, not {part!r}")


def render_bench_judge(spec_name: str, row: Mapping[str, Any], response: str | None, part: str | int | None = None) -> str:
    """The judge prompt of a BenchJudge setting for one row and one student response.

    ``part`` is for CharXiv only: ``"reasoning"`` or the descriptive question index 1..4 (each
    CharXiv row carries one reasoning and four descriptive questions).
    """
    if spec_name == "CharXiv":
        part = _charxiv_part(part)
        return render_charxiv_reasoning(row, response) if part == "reasoning" else render_charxiv_descriptive(row, response, part)
    if part is not None:
        raise ValueError(f"part is for CharXiv only, not {spec_name!r}")
    renderers = {"MM-Vet": render_mmvet, "HLE": render_hle, "MultiCh": render_multich, "MMVU": render_mmvu}
    if spec_name not in renderers:
        raise ValueError(f"{spec_name!r} is not a BenchJudge setting; those are {BENCH_JUDGE_SETTINGS}")
    return renderers[spec_name](row, response)


def score_bench_judge(spec_name: str, row: Mapping[str, Any], reply: str | None) -> JudgeScore:
    """The judge's reply to `render_bench_judge`'s prompt, read by that setting's rule.

    The row is needed for MultiChallenge only (its ``pass_criteria``). Never raises on the
    reply; raises ValueError for an unknown setting or a row without the field it needs.
    """
    if spec_name == "MultiCh":
        return parse_multich(reply, _field(row, SUITE["MultiCh"].answer_field))
    parsers = {"CharXiv": parse_charxiv, "MM-Vet": parse_mmvet, "HLE": parse_hle, "MMVU": parse_mmvu}
    if spec_name not in parsers:
        raise ValueError(f"{spec_name!r} is not a BenchJudge setting; those are {BENCH_JUDGE_SETTINGS}")
    return parsers[spec_name](reply)
