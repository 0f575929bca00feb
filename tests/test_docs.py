"""The README and docs/ name only things that exist: paths, links, make targets, flags, config fields.

A doc that names a renamed flag or a deleted script misleads the researcher who copies the
command. Each check reads the markdown as a user would: relative links and their anchors,
repository paths in backticks, ``make`` targets, every ``--flag`` (ours must be an option of
the script that takes it; another tool's must be on the short list below), the field tables,
and ``zppo_trl.*`` names.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "tests" / "README.md"]


def _doc_id(doc: Path) -> str:
    return "tests/README.md" if doc.parent.name == "tests" else doc.name  # two READMEs


ROOTS = ("recipes/", "zppo_trl/", "tests/", "benchmarks/", "tools/", "docs/", "evaluation/", ".ci/", ".github/")
PRODUCED = ("outputs/", ".cache/", "logs/", "data/")  # written by runs, not in the repository
# Flags of other programs the docs show (vLLM, TRL's vllm-serve, accelerate, pip, transformers serve, pytest, sbatch),
# and "--bogus", the unknown key in a quoted error message.
EXTERNAL_FLAGS = {
    "--max-model-len", "--port", "--host", "--data-parallel-size", "--tensor-parallel-size", "--reasoning-parser",
    "--language-model-only", "--api-key", "--model", "--config_file", "--num_processes", "--num_machines",
    "--machine_rank", "--no-deps", "--device", "--continuous-batching", "--bogus", "--dtype", "--enforce-eager",
    "--mm-processor-kwargs", "--trust-request-mm-kwargs", "--max-logprobs", "--served-model-name",
    "--logprobs-mode", "--worker-extension-cls", "--weight-transfer-config", "--num_cpu_threads_per_process",
    "--durations", "--compile-bytecode", "--enable-scale-out", "--signal", "--requeue", "--open-mode",
}  # fmt: skip
# Our commands that take flags, and how to ask each for its options.
SCRIPTS = {
    "recipes/zppo.py": [sys.executable, "recipes/zppo.py", "--help"],
    "recipes/build_corpus.py": [sys.executable, "recipes/build_corpus.py", "--help"],
    "recipes/demo/plot_run.py": [sys.executable, "recipes/demo/plot_run.py", "--help"],
    **{
        f"recipes/launch/{p.name}": ["bash", f"recipes/launch/{p.name}", "--help"]
        for p in (REPO / "recipes/launch").glob("*.sh")
        if p.name != "common.sh"
    },
    "recipes/launch/slurm_zppo.sbatch": ["bash", "recipes/launch/slurm_zppo.sbatch", "--help"],
    **{
        f"benchmarks/{p.name}": [sys.executable, f"benchmarks/{p.name}", "--help"]
        for p in (REPO / "benchmarks").glob("*.py")
    },
    "tests/boxed_models.py": [sys.executable, "tests/boxed_models.py", "--help"],
    "tools/row_fingerprints.py": [sys.executable, "tools/row_fingerprints.py", "--help"],
    "evaluation/run.py": [sys.executable, "evaluation/run.py", "--help"],
    "evaluation/compare.py": [sys.executable, "evaluation/compare.py", "--help"],
    "zppo-eval run": [sys.executable, "-m", "zppo_trl.evaluation.cli", "run", "--help"],
    "zppo-eval compare": [sys.executable, "-m", "zppo_trl.evaluation.cli", "compare", "--help"],
    "zppo-eval rejudge": [sys.executable, "-m", "zppo_trl.evaluation.cli", "rejudge", "--help"],
    "zppo-eval audit-traces": [sys.executable, "-m", "zppo_trl.evaluation.cli", "audit-traces", "--help"],
    "zppo-eval teacher-capability": [sys.executable, "-m", "zppo_trl.evaluation.cli", "teacher-capability", "--help"],
}


def _text(path: Path) -> str:
    return path.read_text()


def _code_lines(text: str) -> list[str]:
    """Lines of fenced code blocks, continuation backslashes joined."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if inside:
            line = re.split(r"\s#\s", line)[0]  # a shell comment is prose
            if lines and lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1] + " " + line.strip()
            else:
                lines.append(line)
    return lines


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def _inline_code(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", _prose(text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


# Runs each Python command of SCRIPTS (`python X --help`, `python -m M ... --help`) in turn in one interpreter, as
# the interpreter would run it (its own globals, `__main__`, its argv, its directory first on sys.path), and
# writes {name: [exit code, stdout, stderr]} as JSON: a process each would import torch and transformers again,
# about 5-10 s apiece, for 20 commands.
_PYTHON_HELPS = r"""
import contextlib, io, json, os, runpy, sys, traceback
commands, results = json.loads(sys.argv[1]), {}
for name, argv in commands.items():
    out, err, path = io.StringIO(), io.StringIO(), list(sys.path)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
                runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.path[:] = path
    results[name] = [code, out.getvalue(), err.getvalue()]
with open(os.environ["HELP_RESULTS"], "w") as handle:
    json.dump(results, handle)
"""
_ENV = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}


@cache
def _python_helps() -> dict[str, list]:
    """Every Python command's ``--help`` (see _PYTHON_HELPS), from one process."""
    import json
    import tempfile

    commands = {name: argv[1:] for name, argv in SCRIPTS.items() if argv[0] == sys.executable}
    with tempfile.TemporaryDirectory() as scratch:
        results = Path(scratch) / "helps.json"
        run = subprocess.run(
            [sys.executable, "-c", _PYTHON_HELPS, json.dumps(commands)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            env={**_ENV, "HELP_RESULTS": str(results)},
        )
        assert run.returncode == 0 and results.exists(), run.stderr[-2000:]
        return json.loads(results.read_text())


@cache
def _help(script: str) -> str:
    if SCRIPTS[script][0] == sys.executable:
        code, stdout, stderr = _python_helps()[script]
    else:
        run = subprocess.run(SCRIPTS[script], cwd=REPO, capture_output=True, text=True, timeout=180, env=_ENV)
        code, stdout, stderr = run.returncode, run.stdout, run.stderr
    assert code == 0, f"{script} --help failed: {stderr[-1000:]}"
    return stdout


def test_the_docs_exist_and_the_readme_links_every_page():
    readme = _text(REPO / "README.md")
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert len(pages) >= 8
    for page in pages:
        assert f"(docs/{page})" in readme, f"README does not link docs/{page}"
    assert len(readme.splitlines()) < 150, "the README is an overview; reference belongs in docs/"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_links_and_anchors_resolve(doc):
    for target in re.findall(r"\]\(([^)\s]+)\)", _text(doc)):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        assert file.exists(), f"{doc.name}: link to {target} goes nowhere"
        if anchor and file.suffix == ".md":
            headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", _text(file), flags=re.MULTILINE)}
            assert anchor in headings, f"{doc.name}: no heading #{anchor} in {file.name}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_repository_paths_exist(doc):
    for token in [t for t in _inline_code(_text(doc)) if " " not in t] + re.findall(
        r"(?<![\w/.-])((?:" + "|".join(map(re.escape, ROOTS)) + r")[\w./*-]+)", "\n".join(_code_lines(_text(doc)))
    ):
        token = token.rstrip(".,:;)")
        if not token.startswith(ROOTS) or token.startswith(PRODUCED) or "<" in token:  # <capability>: a pattern
            continue
        path = token.split("::")[0]
        matches = list(REPO.glob(path)) if "*" in path else [REPO / path]
        assert matches and all(m.exists() for m in matches), f"{doc.name}: {token} does not exist"


# Other repositories' files, named where docs/evaluation.md says which upstream evaluator a scorer follows.
UPSTREAM_FILES = {
    "calculate_score.py", "eval_your_results.py", "vqa_metric.py", "IoUscore_metric.py", "TEDS_metric.py",
    "page_ocr_metric.py", "spotting_metric.py", "get_score.py", "mm-vet_evaluator.py", "scienceqa.py", "eval.py",
}  # fmt: skip


@cache
def _repository_files() -> frozenset[str]:
    """The names of every file the repository tracks (a fresh clone's), or of the tree where git is not at hand."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
        return frozenset(Path(line).name for line in listed.splitlines())
    except (OSError, subprocess.CalledProcessError):
        return frozenset(p.name for p in REPO.rglob("*") if ".venv" not in p.parts)


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_bare_file_names_exist(doc):
    # a module or script named without its folder (`logp_paths.py` in a table row) must still be one of the
    # repository's (data files named bare, `config.json`, are what runs write)
    for token in _inline_code(_text(doc)):
        for name in re.findall(r"(?<![\w/.-])([A-Za-z_][\w-]*\.(?:py|sh))\b", token):
            if "/" not in token and "*" not in token and name not in UPSTREAM_FILES:
                assert name in _repository_files(), f"{doc.name}: `{name}` is no file of the repository"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_no_commit_of_this_repository_is_named(doc):
    # Docs say what is; which commit a figure was measured on is history, and history is git log's. (Upstream
    # evaluators' commits, `owner/repo ...@abc1234`, are other repositories' and are not checked here.)
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    for token in set(re.findall(r"(?<![\w@/-])([0-9a-f]{7,40})(?![\w-])", _text(doc))):
        if not re.search(r"[a-f]", token) or not re.search(r"[0-9]", token):
            continue
        known = (
            subprocess.run(["git", "cat-file", "-e", f"{token}^{{commit}}"], cwd=REPO, capture_output=True).returncode
            == 0
        )
        assert not known, f"{doc.name}: names commit {token} of this repository"


def test_make_targets_exist():
    targets = set(re.findall(r"^([a-z][\w-]*):", _text(REPO / "Makefile"), flags=re.MULTILINE))
    for doc in DOCS:
        for target in re.findall(r"\bmake ([a-z][\w-]*)", _text(doc)):
            assert target in targets, f"{doc.name}: `make {target}` is no Makefile target"


def test_every_flag_is_an_option_of_the_script_that_takes_it():
    ours: set[str] = set()
    for doc in DOCS:
        text = _text(doc)
        for line in _code_lines(text) + _inline_code(text):
            script = next((s for s in SCRIPTS if s in line), None)
            flags = re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", line)
            if script is None:
                ours.update(flag for flag in flags if flag not in EXTERNAL_FLAGS)
                continue
            after = line.split(script, 1)[1]
            after, _, passed_on = after.partition(" -- ")  # after a bare --: the wrapped program's own flags
            for flag in re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", after):
                assert flag in _help(script) or flag == "--help", (
                    f"{doc.name}: `{script} {flag}` is not an option of {script}"
                )
            for flag in re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", passed_on):
                assert flag in EXTERNAL_FLAGS, (
                    f"{doc.name}: `{flag}`, passed on by {script}, is not on the list of other tools' flags"
                )
    # A flag named outside a command line (prose, tables) is an option of one of our scripts
    # (the recipe's first: its flags are the YAML keys).
    for flag in sorted(ours):
        assert any(flag in _help(script) for script in SCRIPTS), (
            f"{flag} is no option of our scripts nor on the list of other tools' flags"
        )


@pytest.fixture(scope="module")
def recipe_fields() -> set[str]:
    from trl import ModelConfig

    from zppo_trl import ZPPOConfig

    spec = importlib.util.spec_from_file_location("recipe_zppo_for_docs", REPO / "recipes" / "zppo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return (
        set(ZPPOConfig.__dataclass_fields__)
        | set(module.ScriptArguments.__dataclass_fields__)
        | set(ModelConfig.__dataclass_fields__)
    )


def test_configuration_tables_name_real_fields(recipe_fields):
    text = _text(REPO / "docs" / "configuration.md")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) > 20
    for row in rows:
        for name in re.findall(r"`([a-z_]+)`", row.split("|")[1]):
            assert name in recipe_fields, f"docs/configuration.md names `{name}`, which is no field"


def test_zppo_trl_names_resolve():
    for doc in DOCS:
        for name in set(re.findall(r"`(zppo_trl(?:\.\w+)+)`", _text(doc))):
            parts = name.split(".")
            for split in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:split]))
                except ImportError:
                    continue
                for attr in parts[split:]:
                    assert hasattr(obj, attr), f"{doc.name}: `{name}` does not resolve"
                    obj = getattr(obj, attr)
                break
            else:
                pytest.fail(f"{doc.name}: `{name}` does not resolve")
