"""MM-Vet: open-ended integrated capabilities; scored by MM-Vet's own graded judge prompt
(BenchJudge); the score is the mean of the [0, 1] grades."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ...prompts import fill
from ..metrics import UNPARSED, judge_response, judge_text
from ..spec import BenchJudge, JudgeScore, TaskSpec

# The paper's MM-Vet judge figure.
# VERBATIM from the paper: the instruction paragraph, the table header, the exemplar rows
# "x = 3 | 0.0", "x = -1 | 0.5", "x = -1 or x = -5 | 1.0", and the query row.
# RECONSTRUCTED (the figure's "... remaining fixed MM-Vet exemplars"): the rows "x = -5 | 0.5",
# "x = -5 or 5 | 0.5" and the two "Can you explain this meme?" rows, and the row order, from
# yuweihao/MM-Vet mm-vet_evaluator.py (commit c7ff270d86fb79c42346214366f4192c0e08b042, the
# module-level `prompt`). The blank line before the query row and the query row's trailing
# " | " also follow that evaluator, which sends ``prompt + "\n" + " | ".join([q, gt, pred, ""])``.
# Long lines are continued with a backslash, which adds no character to the text.
MMVET_TEMPLATE = """Compare the ground truth and prediction from AI models, to give a correctness score for the \
prediction. <AND> in the ground truth means it is totally right only when all elements in the ground truth are \
present in the prediction, and <OR> means it is totally right when any one element in the ground truth is present in \
the prediction. The correctness score is 0.0 (totally wrong), 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, or 1.0 \
(totally right). Just complete the last space of the correctness score.

Question | Ground truth | Prediction | Correctness
--- | --- | --- | ---
What is x in the equation? | -1 <AND> -5 | x = 3 | 0.0
What is x in the equation? | -1 <AND> -5 | x = -1 | 0.5
What is x in the equation? | -1 <AND> -5 | x = -5 | 0.5
What is x in the equation? | -1 <AND> -5 | x = -5 or 5 | 0.5
What is x in the equation? | -1 <AND> -5 | x = -1 or x = -5 | 1.0
Can you explain this meme? | This meme is poking fun at the fact that the names of the countries Iceland and \
Greenland are misleading. Despite its name, Iceland is known for its beautiful green landscapes, while Greenland is \
mostly covered in ice and snow. The meme is saying that the person has trust issues because the names of these \
countries do not accurately represent their landscapes. | The meme talks about Iceland and Greenland. It's pointing \
out that despite their names, Iceland is not very icy and Greenland isn't very green. | 0.4
Can you explain this meme? | This meme is poking fun at the fact that the names of the countries Iceland and \
Greenland are misleading. Despite its name, Iceland is known for its beautiful green landscapes, while Greenland is \
mostly covered in ice and snow. The meme is saying that the person has trust issues because the names of these \
countries do not accurately represent their landscapes. | The meme is using humor to point out the misleading nature \
of Iceland's and Greenland's names. Iceland, despite its name, has lush green landscapes while Greenland is mostly \
covered in ice and snow. The text 'This is why I have trust issues' is a playful way to suggest that these \
contradictions can lead to distrust or confusion. The humor in this meme is derived from the unexpected contrast \
between the names of the countries and their actual physical characteristics. | 1.0

{{ question }} | {{ ground_truth }} | {{ prediction }} | """


def render_mmvet(row: Mapping[str, Any], response: str | None) -> str:
    """MM-Vet's judge prompt for one row; ``<AND>``/``<OR>`` are spaced out as upstream does."""
    answer = judge_text(row, MMVET.answer_field).replace("<AND>", " <AND> ").replace("<OR>", " <OR> ")
    return fill(
        MMVET_TEMPLATE, question=judge_text(row, MMVET.question_field), ground_truth=answer,
        prediction=judge_response(response),
    )  # fmt: skip


# The first token: a plain decimal (upstream float()s it; this refuses what float() would also
# take but a grade never is: "nan", "inf", "1e-1", "1_0", signs).
_GRADE = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def parse_mmvet(reply: str | None) -> JudgeScore:
    """MM-Vet's graded reading: the reply's first token is a float in [0, 1], which is the score.

    As upstream (``float(content.split(" ")[0].strip())`` in [0, 1]), text after the first token
    is ignored; leading whitespace and a newline after the grade are tolerated. Upstream re-asks
    up to five times on a bad reply; here one call is made and a bad reply scores 0, flagged.
    """
    if not isinstance(reply, str):
        return UNPARSED
    tokens = reply.split()
    if not tokens or not _GRADE.fullmatch(tokens[0]):
        return UNPARSED
    grade = float(tokens[0])
    if not (math.isfinite(grade) and 0.0 <= grade <= 1.0):
        return UNPARSED
    return JudgeScore(grade, True)


MMVET = TaskSpec(
    "MM-Vet", "vlm", "MM-Vet", "benchjudge", "lmms-lab/MMVet", "test",  # upstream
    "question", "answer", image_field="image", aggregation="graded",  # upstream; <AND>/<OR> tags in answer
    extra_fields=("capability",),
    bench_judge=BenchJudge(render=render_mmvet, parse=lambda row, reply: parse_mmvet(reply)),
)  # fmt: skip

SPECS = (MMVET,)
