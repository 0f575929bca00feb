"""The paper's 31-setting evaluation suite and its shared decoding configuration, as data.

Source of truth: the appendix "Evaluation benchmarks" of the paper
(`sec:appendix:benchmarks`, tables `tab:appendix:vlm_benchmarks`, `tab:appendix:llm_benchmarks`,
`tab:appendix:video_benchmarks`, and the "Decoding configuration" paragraph). Name, family,
scoring path, Hugging Face id, the splits and subsets the tables name, the stated sizes and the
three official aggregation rules are the paper's. The paper does not give the upstream column
names or the splits it leaves unnamed; those follow the upstream datasets' published schemas and
are marked ``# upstream`` (schema known) or ``# assumption`` (a choice the paper leaves open).
"""

from __future__ import annotations

from dataclasses import dataclass

FAMILY_NAMES = ("vlm", "llm", "video")
SCORINGS = ("exact+judge", "rule+judge", "det", "benchjudge")
AGGREGATIONS = ("mean", "worst_case_variants", "mean_of_tasks", "graded")
ALL_CONFIGS = "*"
"""`TaskSpec.subset` value meaning every config of the dataset (loaders enumerate them with
`datasets.get_dataset_config_names`): the paper's "all 52 subjects", "20 task configs", ..."""

Fields = str | tuple[str, ...] | None


@dataclass(frozen=True)
class TaskSpec:
    """One evaluation setting of the suite.

    A tuple-valued field means several upstream items: `subset` and `split` name configs or
    splits to concatenate; `options_field` names option columns in display order (C-Eval's
    ``A``..``D``); `answer_field` names alternative answer columns, the filled one counting;
    `image_field` names every image column a row may fill. `aggregation` is how per-item
    scores become the setting's score: ``mean`` (item accuracy), ``graded`` (mean of MM-Vet's
    [0, 1] judge grades), ``worst_case_variants`` (an item counts only when all its variants,
    grouped by `group_field`, are correct), ``mean_of_tasks`` (the mean of per-`group_field`
    accuracies). `row_filter` is ``(column, suffix)``: keep rows whose column ends with suffix.
    `size` is the number of scored units where the paper states it.
    """

    name: str
    family: str
    title: str
    scoring: str
    dataset: str
    split: str | tuple[str, ...]
    question_field: str | None
    answer_field: Fields
    subset: str | tuple[str, ...] | None = None
    options_field: Fields = None
    image_field: Fields = None
    video_field: str | None = None
    aggregation: str = "mean"
    group_field: str | None = None
    row_filter: tuple[str, str] | None = None
    subtitles: bool = False
    size: int | None = None
    extra_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in FAMILY_NAMES:
            raise ValueError(f"{self.name}: family {self.family!r} is not one of {FAMILY_NAMES}")
        if self.scoring not in SCORINGS:
            raise ValueError(f"{self.name}: scoring {self.scoring!r} is not one of {SCORINGS}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"{self.name}: aggregation {self.aggregation!r} is not one of {AGGREGATIONS}")
        if self.aggregation in ("worst_case_variants", "mean_of_tasks") and self.group_field is None:
            raise ValueError(f"{self.name}: aggregation {self.aggregation!r} needs a group_field")


@dataclass(frozen=True)
class DecodingConfig:
    """Sampling settings; None means the paper sets nothing (the server's default applies).

    `passes` is the number of evaluation passes averaged for a frozen checkpoint (the paper's
    untrained base rows and teacher rows); a trained checkpoint is evaluated once per training
    run, and its reported cell is the mean over five runs. Pixel bounds are image pixel counts.
    """

    temperature: float
    top_p: float
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    max_model_len: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    passes: int = 1


PAPER_DECODING = DecodingConfig(
    temperature=0.6,
    top_p=0.95,
    top_k=20,
    min_p=0.0,
    presence_penalty=1.5,
    repetition_penalty=1.0,
    max_new_tokens=12_288,
    max_model_len=262_144,
    min_pixels=256 * 32 * 32,
    max_pixels=1280 * 32 * 32,
    passes=5,
)
"""The one decoding configuration of every setting, method and checkpoint of the suite."""

JUDGE_DECODING = DecodingConfig(temperature=0.0, top_p=1.0, max_new_tokens=512)
"""The shared judge's decoding (Qwen3.5-27B-FP8 on its own pool)."""

_MMMU_PRO_IMAGES = ("image",) + tuple(f"image_{i}" for i in range(1, 8))  # upstream: vision config / standard configs
# upstream; the options are shuffled at prompt time
_GPQA_OPTIONS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")

_SPECS = (
    # --- 16 VLM settings (tab:appendix:vlm_benchmarks) ---
    TaskSpec("AI2D", "vlm", "AI2 Diagrams", "exact+judge", "lmms-lab/ai2d", "test",  # upstream (only split)
             "question", "answer", options_field="options", image_field="image"),  # upstream; answer is the option index
    TaskSpec("BabyV", "vlm", "BabyVision", "exact+judge", "UnipatAI/BabyVision", "train",  # upstream
             "question", ("choiceAns", "blankAns"), options_field="options", image_field="image",  # upstream
             extra_fields=("ansType",)),  # upstream: says which answer column is filled
    # The paper judges CharXiv with both its Reasoning and Descriptive wrappers; the descriptive
    # questions live in descriptive_q1..4 / descriptive_a1..4 of the same rows (upstream).
    # assumption: the validation split, the one whose answers are public (also InfoVQA's).
    TaskSpec("CharXiv", "vlm", "CharXiv", "benchjudge", "princeton-nlp/CharXiv", "validation",
             "reasoning_q", "reasoning_a", image_field="image",  # upstream
             # reasoning_a_type picks CharXiv's reasoning rubric (1-4) in the benchmark judge (judges.py)
             extra_fields=("reasoning_q_source", "reasoning_a_type") + tuple(f"descriptive_{k}{i}" for i in range(1, 5) for k in "qa")),
    TaskSpec("DynaM", "vlm", "DynaMath", "exact+judge", "DynaMath/DynaMath_Sample",
             tuple(f"sample_variant{i}" for i in range(1, 11)),  # upstream: one split per variant
             "question", "ground_truth", image_field="decoded_image",  # upstream
             aggregation="worst_case_variants", group_field="id", size=501, extra_fields=("answer_type",)),
    TaskSpec("EmbSp", "vlm", "EmbSpatial-Bench", "exact+judge", "FlagEval/EmbSpatial-Bench", "test",  # upstream
             "question", "answer", options_field="answer_options", image_field="image"),  # upstream
    TaskSpec("InfoVQA", "vlm", "InfographicVQA", "det", "lmms-lab/DocVQA", "validation",
             "question", "answers", subset="InfographicVQA", image_field="image"),  # upstream; answers: accepted strings
    TaskSpec("MVerse", "vlm", "MathVerse", "exact+judge", "CaraJ/MathVerse-lmmseval", "testmini",
             "question", "answer", subset="testmini", image_field="image",  # upstream
             extra_fields=("problem_version", "question_type")),
    TaskSpec("MVision", "vlm", "MathVision", "exact+judge", "MathLLMs/MathVision", "test",  # assumption: full test set
             "question", "answer", options_field="options", image_field="decoded_image"),  # upstream
    TaskSpec("MVista", "vlm", "MathVista", "rule+judge", "AI4Math/MathVista", "testmini",
             "question", "answer", options_field="choices", image_field="decoded_image",  # upstream
             extra_fields=("question_type", "answer_type", "precision", "unit")),
    # The vision config has no question column: the question is rendered inside the image.
    TaskSpec("MMMU-Pro", "vlm", "MMMU-Pro", "exact+judge", "MMMU/MMMU_Pro", "test",  # upstream
             "question", "answer", subset=("standard (4 options)", "standard (10 options)", "vision"),  # upstream config names
             options_field="options", image_field=_MMMU_PRO_IMAGES),
    TaskSpec("MM-Vet", "vlm", "MM-Vet", "benchjudge", "lmms-lab/MMVet", "test",  # upstream
             "question", "answer", image_field="image", aggregation="graded",  # upstream; <AND>/<OR> tags in answer
             extra_fields=("capability",)),
    TaskSpec("OCR-EN", "vlm", "OCRBench v2", "det", "ling99/OCRBench_v2", "test",  # upstream
             "question", "answers", image_field="image", row_filter=("type", " en"),  # upstream: task types end in " en"/" cn"
             extra_fields=("eval",)),
    TaskSpec("OCR-ZH", "vlm", "OCRBench v2", "det", "ling99/OCRBench_v2", "test",  # upstream
             "question", "answers", image_field="image", row_filter=("type", " cn"),  # upstream
             extra_fields=("eval",)),
    TaskSpec("VisP", "vlm", "VisualPuzzles", "exact+judge", "neulab/VisualPuzzles", "train",  # upstream
             "question", "answer", options_field="options", image_field="image"),  # upstream
    TaskSpec("VBlind", "vlm", "VLMs-are-Blind", "exact+judge", "XAI/vlmsareblind", "valid",  # upstream
             "prompt", "groundtruth", image_field="image",  # upstream
             aggregation="mean_of_tasks", group_field="task"),  # upstream: the 7 BlindTest task names
    TaskSpec("WeMath", "vlm", "WeMath", "exact+judge", "We-Math/We-Math", "testmini",
             "question", "answer", options_field="option", image_field="image_path"),  # upstream: image_path holds the image
    # --- 10 LLM settings (tab:appendix:llm_benchmarks) ---
    TaskSpec("AIME25", "llm", "AIME 2025", "exact+judge", "opencompass/AIME2025", "test",  # upstream
             "question", "answer", subset=("AIME2025-I", "AIME2025-II"), size=30),  # upstream
    TaskSpec("AIME26", "llm", "AIME 2026", "exact+judge", "MathArena/aime_2026", "train",  # upstream
             "problem", "answer", size=30),  # upstream
    TaskSpec("CEval", "llm", "C-Eval", "exact+judge", "ceval/ceval-exam", "val",
             "question", "answer", subset=ALL_CONFIGS, options_field=("A", "B", "C", "D")),  # upstream; 52 subject configs
    TaskSpec("GPQA-D", "llm", "GPQA-Diamond", "exact+judge", "Idavidrein/gpqa", "train",  # upstream (only split)
             "Question", "Correct Answer", subset="gpqa_diamond", options_field=_GPQA_OPTIONS, size=198),  # upstream
    TaskSpec("HLE", "llm", "Humanity's Last Exam", "benchjudge", "cais/hle", "test",  # upstream
             "question", "answer", image_field="image", extra_fields=("answer_type",)),  # upstream; image empty on text rows
    TaskSpec("IMO-AB", "llm", "IMO-AnswerBench", "exact+judge", "OpenEvals/IMO-AnswerBench", "train",  # upstream
             "Problem", "Short Answer"),  # upstream
    TaskSpec("MMLU", "llm", "MMLU", "exact+judge", "cais/mmlu", "test",
             "question", "answer", subset="all", options_field="choices"),  # upstream; answer is the option index
    TaskSpec("MMLU-Pro", "llm", "MMLU-Pro", "exact+judge", "TIGER-Lab/MMLU-Pro", "test",  # upstream
             "question", "answer", options_field="options"),  # upstream; answer is the option letter
    TaskSpec("MMLU-Rd", "llm", "MMLU-Redux 2.0", "exact+judge", "edinburgh-dawg/mmlu-redux-2.0", "test",  # upstream
             "question", "answer", subset=ALL_CONFIGS, options_field="choices"),  # upstream; 57 subject configs
    # The judge alone sees the per-instance criterion (target_question), never the student.
    TaskSpec("MultiCh", "llm", "MultiChallenge", "benchjudge", "ScaleAI/MultiChallenge", "test",  # upstream
             "conversation", "pass_criteria",  # assumption: lower-cased columns of the upstream release
             extra_fields=("target_question", "axis")),
    # --- 5 Video settings (tab:appendix:video_benchmarks) ---
    TaskSpec("MMVU", "video", "MMVU", "benchjudge", "yale-nlp/MMVU", "validation",
             "question", "answer", options_field="choices", video_field="video",  # assumption: video column name
             size=1000, extra_fields=("question_type",)),  # upstream: multiple-choice / open-ended
    TaskSpec("MVBench", "video", "MVBench", "rule+judge", "OpenGVLab/MVBench", "train",  # upstream
             "question", "answer", subset=ALL_CONFIGS, options_field="candidates", video_field="video"),  # upstream
    TaskSpec("VMME", "video", "Video-MME", "rule+judge", "lmms-lab/Video-MME", "test",  # upstream
             "question", "answer", options_field="options", video_field="videoID"),  # upstream: file stem of video and subtitles
    TaskSpec("VMME-S", "video", "Video-MME", "rule+judge", "lmms-lab/Video-MME", "test",  # upstream
             "question", "answer", options_field="options", video_field="videoID", subtitles=True),
    TaskSpec("VMMMU", "video", "Video-MMMU", "rule+judge", "lmms-lab/VideoMMMU", "test",  # upstream
             "question", "answer", subset=ALL_CONFIGS,  # assumption: all of Perception, Comprehension, Adaptation
             options_field="options", video_field="id", extra_fields=("question_type",)),  # upstream: video file named after id
)  # fmt: skip

SUITE: dict[str, TaskSpec] = {spec.name: spec for spec in _SPECS}
"""Setting name -> spec, in the order of the paper's tables (VLM, then LLM, then Video)."""

FAMILIES: dict[str, tuple[str, ...]] = {
    family: tuple(spec.name for spec in _SPECS if spec.family == family) for family in FAMILY_NAMES
}
"""Family -> its setting names in table order: 16 VLM, 10 LLM, 5 Video."""


def select(spec: str) -> list[str]:
    """Resolve a comma-separated selection of families and settings to setting names.

    Entries are family names (``vlm``, ``llm``, ``video``), setting names, or ``all``, matched
    case-insensitively and freely mixed (``"vlm,GPQA-D"``). The result is in suite order
    without repeats, so a report's columns do not depend on how the selection was typed.
    """
    by_lower = {name.lower(): name for name in SUITE}
    chosen: set[str] = set()
    entries = [entry.strip() for entry in spec.split(",") if entry.strip()]
    if not entries:
        raise ValueError(f"empty benchmark selection {spec!r}")
    for entry in entries:
        key = entry.lower()
        if key == "all":
            chosen.update(SUITE)
        elif key in FAMILIES:
            chosen.update(FAMILIES[key])
        elif key in by_lower:
            chosen.add(by_lower[key])
        else:
            raise ValueError(
                f"unknown benchmark or family {entry!r}; families: all, {', '.join(FAMILY_NAMES)}; "
                f"settings: {', '.join(SUITE)}"
            )
    return [name for name in SUITE if name in chosen]
