"""The suite in zppo_trl.evaluation.tasks is the paper's: checked against the .tex at test time.

The three benchmark tables of the appendix (VLM, LLM and Video; their LaTeX labels are in
`TABLES`) and its "Decoding configuration" paragraph are parsed from the paper source,
so an edit to either the paper or SUITE that makes them disagree fails here.
"""

from __future__ import annotations

import math
import re

import pytest

from zppo_trl.evaluation.tasks import ALL_CONFIGS, FAMILIES, PAPER_DECODING, SUITE, select

TABLES = {
    "vlm": "tab:appendix:vlm_benchmarks",
    "llm": "tab:appendix:llm_benchmarks",
    "video": "tab:appendix:video_benchmarks",
}


@pytest.fixture(scope="module")
def tex(paper_tex) -> str:
    return paper_tex


def _tabular_rows(tex: str, label: str) -> list[list[str]]:
    """Cells of the data rows (between \\midrule and \\bottomrule) of the tabular after `label`."""
    start = tex.index(f"\\label{{{label}}}")
    body = tex[start : tex.index("\\end{tabular}", start)]
    body = body[body.index("\\midrule") + len("\\midrule") : body.index("\\bottomrule")]
    return [[cell.strip() for cell in row.split("&")] for row in body.split("\\\\") if row.strip()]


def _setting_name(cell: str) -> str:
    """The paper's abbreviation in ASCII: ``OCR$^\\text{EN}$`` -> ``OCR-EN``."""
    return re.sub(r"\$\^\\text\{(\w+)\}\$", r"-\1", cell).strip()


def _paper_suite(tex: str) -> dict[str, dict]:
    suite = {}
    for family, label in TABLES.items():
        for name, full_name, scoring, source in _tabular_rows(tex, label):
            ids = [s.replace("\\_", "_") for s in re.findall(r"\\texttt\{([^}]*)\}", source)]
            suite[_setting_name(name)] = {
                "family": family,
                "full_name": re.sub(r"~?\\citep\{[^}]*\}", "", full_name).strip(),
                "scoring": re.fullmatch(r"\\textsc\{([^}]*)\}", scoring).group(1).rstrip(".").lower(),
                "dataset": ids[0],
                "subset": ids[1] if len(ids) > 1 else None,
            }
    return suite


def test_suite_is_the_papers_31_settings_in_table_order(tex):
    paper = _paper_suite(tex)
    assert list(SUITE) == list(paper)
    assert len(SUITE) == 31
    assert {family: len(names) for family, names in FAMILIES.items()} == {"vlm": 16, "llm": 10, "video": 5}
    assert [name for names in FAMILIES.values() for name in names] == list(SUITE)


def test_each_setting_has_the_papers_family_scoring_and_source(tex):
    for name, row in _paper_suite(tex).items():
        spec = SUITE[name]
        assert spec.name == name
        assert (spec.family, spec.scoring, spec.dataset) == (row["family"], row["scoring"], row["dataset"]), name
        if row["subset"] is not None:  # the table names a config beside the id: InfoVQA's InfographicVQA
            assert spec.subset == row["subset"], name
        assert row["full_name"].startswith(spec.title), name


def test_splits_subsets_and_sizes_named_in_the_tables(tex):
    """Every split, config count and size the "Full name" column states is in the spec."""
    checked = 0
    for name, row in _paper_suite(tex).items():
        spec, full = SUITE[name], row["full_name"]
        for split in re.findall(r"\(\\texttt\{(?!all\})(\w+)\}", full):  # "(\texttt{testmini})", "(\texttt{val}, ..."
            assert spec.split == split, name
            checked += 1
        if size := re.search(r"\$([\d{},]+)\$ (?:rows|problems|seeds)", full):
            assert spec.size == int(re.sub(r"[{},]", "", size.group(1))), name
            checked += 1
        if configs := re.search(r"\$(\d+)\$ (?:configs|subjects|task configs)", full):
            expected = int(configs.group(1))
            assert spec.subset == ALL_CONFIGS or len(spec.subset) == expected, name
            checked += 1
        if "all subjects" in full:
            assert spec.subset == "all", name  # cais/mmlu's config holding every subject
        if "with subtitles" in full or "w/o subtitles" in full:
            assert spec.subtitles == ("with subtitles" in full), name
    assert checked >= 12  # the parse found the annotations, not nothing


def test_official_aggregation_rules(tex):
    """The three settings the paper scores by their official rule instead of item accuracy."""
    section = tex[tex.index("\\label{sec:appendix:benchmarks}") : tex.index("\\label{tab:appendix:vlm_benchmarks}")]
    assert "DynaMath is scored worst-case" in section and "VBlind averages the $7$ BlindTest tasks" in section
    assert "MM-Vet uses its own graded $[0,1]$" in section
    special = {name: spec.aggregation for name, spec in SUITE.items() if spec.aggregation != "mean"}
    assert special == {"DynaM": "worst_case_variants", "VBlind": "mean_of_tasks", "MM-Vet": "graded"}
    assert len(SUITE["DynaM"].split) == 10  # "$10$ generated variants" per seed
    assert (
        SUITE["OCR-EN"].dataset == SUITE["OCR-ZH"].dataset and SUITE["OCR-EN"].row_filter != SUITE["OCR-ZH"].row_filter
    )


def test_decoding_configuration_is_the_papers(tex):
    start = tex.index("\\paragraph{Decoding configuration.}")
    paragraph = tex[start : tex.index("\\paragraph", start + 1)]
    evaluation = paragraph[paragraph.index("Evaluation uses") :]
    values = dict(re.findall(r"\\texttt\{([a-z-]+)=([^}]*)\}", evaluation))

    def number(text: str) -> float:
        return math.prod(float(factor) for factor in text.split("$\\times$"))  # "256$\times$32$\times$32"

    fields = {name.replace("-", "_"): number(text) for name, text in values.items()}
    assert len(fields) == 10
    for field, value in fields.items():
        assert getattr(PAPER_DECODING, field) == value, field
    assert "Mean of five evaluation passes" in tex and PAPER_DECODING.passes == 5


def test_select_resolves_families_and_names():
    assert select("vlm") == list(FAMILIES["vlm"])
    assert select("vlm,llm") == list(FAMILIES["vlm"] + FAMILIES["llm"])
    assert select("Video") == list(FAMILIES["video"])
    assert select("GPQA-D, AI2D") == ["AI2D", "GPQA-D"]  # suite order, whatever the typed order
    assert select("video,vmme,MVBench") == list(FAMILIES["video"])  # repeats collapse
    assert select("llm,AI2D") == ["AI2D", *FAMILIES["llm"]]
    assert select("all") == list(SUITE)
    assert select("mmmu-pro") == ["MMMU-Pro"]


@pytest.mark.parametrize("bad", ["vlm,NoSuchBench", "OCR", "", " , "])
def test_select_rejects_unknown_entries(bad):
    with pytest.raises(ValueError) as error:
        select(bad)
    if bad.strip(" ,"):
        assert repr(bad.split(",")[-1].strip()) in str(error.value)
        assert "AI2D" in str(error.value) and "video" in str(error.value)  # lists what is valid


def test_specs_are_frozen_and_validated():
    spec = SUITE["AI2D"]
    with pytest.raises(AttributeError):
        spec.dataset = "other/dataset"
    with pytest.raises(ValueError, match="scoring"):
        type(spec)("X", "vlm", "X", "exact", "a/b", "test", "q", "a")
    with pytest.raises(ValueError, match="group_field"):
        type(spec)("X", "vlm", "X", "det", "a/b", "test", "q", "a", aggregation="mean_of_tasks")


def test_the_repositorys_copy_of_the_paper_is_the_spec():
    from conftest import PAPER_TEX, PAPER_TEX_COPY

    if not PAPER_TEX.is_file():
        pytest.skip(f"no shared checkout of the paper at {PAPER_TEX} to compare tests/data's copy with")
    assert PAPER_TEX_COPY.read_text() == PAPER_TEX.read_text(), (
        "tests/data/zppo-paper.tex is stale: copy the paper again"
    )
