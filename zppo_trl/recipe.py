"""What a recipe run reads and builds: the recipe's own arguments, recipe YAMLs with ``base:``
inheritance, the grouped command-line parser, the student, the reward functions and the
servers a run waits for.

``recipes/zppo.py`` is these pieces put in order (parse, build, train); a script of your own,
a notebook or a test can use them the same way::

    from zppo_trl.recipe import parse_recipe_args

    script_args, args, model_args = parse_recipe_args(["--config", "recipes/rows/grpo_dagger.yaml"])

A recipe YAML sets fields of three dataclasses: `ScriptArguments` (the dataset and what the
script does besides training), `zppo_trl.ZPPOConfig` (training and the ZPPO method) and
`trl.ModelConfig` (the student). A YAML with a ``base:`` key (the paper's comparison rows in
``recipes/rows/``) is its base recipe with the YAML's own fields on top.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import torch
import transformers
import yaml
from trl import GRPOConfig, ModelConfig, TrlParser

from .backbones import backbone_family, unsupported_reason
from .config import ZPPOConfig
from .processing import load_processor
from .rewards import boxed_accuracy_reward, judged_accuracy_reward
from .teacher import TeacherClient

__all__ = [
    "RecipeError",
    "ScriptArguments",
    "build_parser",
    "endpoints",
    "is_vision_language",
    "load_recipe",
    "recipe_changes",
    "load_student",
    "parse_recipe_args",
    "release_distributed",
    "resolve_base",
    "reward_functions",
    "student_config",
    "wait_for_servers",
]

logger = logging.getLogger("zppo")


@dataclass
class ScriptArguments:
    """What to train on, and what the recipe script does besides training."""

    dataset_name: str = field(
        default="zppo-trl/ZPPO-77K",
        metadata={
            "help": "Hub dataset id, or a local .parquet/.jsonl file, a folder of them, or a save_to_disk folder "
            "(schema of zppo_trl.data)."
        },
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset config name."})
    dataset_split: str = field(default="train", metadata={"help": "Split to train on."})
    skip_invalid: bool = field(
        default=False,
        metadata={
            "help": "Drop rows that break the schema (counted and logged) instead of stopping at the first one."
        },
    )
    use_judge: bool = field(
        default=True,
        metadata={
            "help": "Send answers the boxed grader scores 0 to the judge (judge_base_url, by default the teacher's "
            "server)."
        },
    )
    teacher_wait_s: float = field(
        default=900.0,
        metadata={
            "help": "Seconds to wait for the teacher (and judge) to answer /v1/models before training; 0 skips the "
            "check."
        },
    )
    num_training_ranks: int | None = field(
        default=None,
        metadata={
            "help": "Training processes the recipe is sized for; a dry run plans for it, a real run warns when the "
            "launch differs."
        },
    )
    dry_run: bool = field(
        default=False,
        metadata={
            "help": "Validate config, dataset, model config and servers without loading weights; print the step "
            "composition and process layout."
        },
    )
    model_license: str | None = field(
        default=None,
        metadata={
            "help": "License id for the model card's metadata, e.g. apache-2.0 (the student's license; left out "
            "when unset)."
        },
    )
    rank_digests: bool = field(
        default=False,
        metadata={
            "help": "Every rank appends a digest of its weights and ZPPO state after each update to "
            "output_dir/rank_digests/rank<R>.jsonl, to check that the ranks agree (zppo_trl.rank_digest)."
        },
    )
    print_server_lengths: bool = field(
        default=False,
        metadata={
            "help": "Print the student's and the teacher's server --max-model-len for this recipe (two numbers) and "
            "exit; recipes/launch uses it."
        },
    )


class RecipeError(ValueError):
    """A recipe or command line that cannot be used; the message is one line naming what to fix."""


# ---------------------------------------------------------------------- recipe YAMLs and the parser


_OLD_KEY, _NEW_KEY = "reformulations", "augmentations"  # the field's deprecated name, and its name


def _renamed(fields: dict, where: str) -> dict:
    """``fields`` with the deprecated key ``reformulations`` renamed ``augmentations`` (a FutureWarning), so
    that a recipe level written with the old key overrides its base's new one, as it always has."""
    if _OLD_KEY not in fields:
        return fields
    fields = dict(fields)
    old = fields.pop(_OLD_KEY)
    if _NEW_KEY in fields and fields[_NEW_KEY] != old:
        raise ValueError(
            f"{where}: augmentations {fields[_NEW_KEY]} and reformulations {old} disagree; set only augmentations"
        )
    warnings.warn(f"{where}: reformulations is deprecated, it is now called augmentations; write augmentations: {old}",
                  FutureWarning, stacklevel=2)  # fmt: skip
    fields[_NEW_KEY] = old
    return fields


def load_recipe(path: str | os.PathLike, _seen: tuple[str, ...] = ()) -> dict:
    """The fields of a recipe YAML; a ``base:`` (relative to the YAML) is loaded first and overridden.
    Each level's deprecated ``reformulations`` key is read as ``augmentations``."""
    path = os.path.abspath(path)
    if path in _seen:
        raise ValueError(f"{path}: base recipes form a cycle ({' -> '.join(_seen + (path,))})")
    if not os.path.isfile(path):
        raise ValueError(f"config {path} does not exist" + (f" (the base of {_seen[-1]})" if _seen else ""))
    fields = read_yaml(path)
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: a recipe is a mapping of field: value")
    fields = _renamed(fields, path)
    base = fields.pop("base", None)
    if base is None:
        return fields
    return {**load_recipe(os.path.join(os.path.dirname(path), base), (*_seen, path)), **fields}


# Where a run writes and publishes: not what it trains.
WHERE_IT_WRITES = ("output_dir", "hub_model_id")


def recipe_changes(path: str | os.PathLike, base: str | os.PathLike) -> dict:
    """The fields the recipe at ``path`` sets otherwise than the recipe at ``base`` (each through its bases), except
    where a run writes and publishes (``output_dir``, ``hub_model_id``): what a comparison row changes of the paper's
    recipe, for a benchmark or tool that trains the row at its own size."""
    reference = load_recipe(base)
    return {k: v for k, v in load_recipe(path).items() if reference.get(k) != v and k not in WHERE_IT_WRITES}


def read_yaml(path: str | os.PathLike) -> object:
    """A YAML file's content (``{}`` for an empty one); a syntax error is a ``ValueError`` naming the file,
    line and column where YAML found it, and what it found."""
    with open(path) as f:
        try:
            return yaml.safe_load(f) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
            what = " ".join(part for part in (getattr(err, "context", None), getattr(err, "problem", None)) if part)
            raise ValueError(f"{where}: YAML syntax error: {what or _first_line(err)}") from None


def resolve_base(argv: list[str]) -> list[str]:
    """``argv`` with a ``--config`` that has a ``base:`` (or the deprecated ``reformulations`` key) replaced by
    the merged recipe (a temporary file), and a ``--reformulations`` flag read as ``--augmentations``."""
    if f"--{_OLD_KEY}" in argv:
        warnings.warn("--reformulations is deprecated, it is now called --augmentations", FutureWarning, stacklevel=2)
        argv = [f"--{_NEW_KEY}" if arg == f"--{_OLD_KEY}" else arg for arg in argv]
    if "--config" not in argv or argv.index("--config") + 1 >= len(argv):
        return argv
    at = argv.index("--config") + 1
    fields = read_yaml(argv[at])
    if not isinstance(fields, dict) or not ({"base", _OLD_KEY} & set(fields)):
        return argv
    merged = tempfile.NamedTemporaryFile("w", prefix="zppo-recipe-", suffix=".yaml", delete=False)
    with merged:
        yaml.safe_dump(load_recipe(argv[at]), merged)
    return [*argv[:at], merged.name, *argv[at + 1 :]]


def build_parser() -> TrlParser:
    """The recipe's parser, its ``--help`` grouped: ZPPO's own fields first, then the script's, the TRL
    fields whose defaults the paper changes, the student's, and every other training field last."""
    parser = TrlParser((ScriptArguments, ZPPOConfig, ModelConfig))
    zppo_own = set(ZPPOConfig.__annotations__)
    groups = [
        ("ZPPO (zppo_trl.ZPPOConfig)", zppo_own - set(GRPOConfig.__dataclass_fields__)),
        ("this script (recipes/zppo.py)", set(ScriptArguments.__dataclass_fields__)),
        ("TRL fields at the paper's values", zppo_own & set(GRPOConfig.__dataclass_fields__)),
        (
            "the student (trl.ModelConfig)",
            set(ModelConfig.__dataclass_fields__) - set(ZPPOConfig.__dataclass_fields__),
        ),
    ]
    parser.usage = (
        "accelerate launch recipes/zppo.py --config YAML [--FIELD VALUE ...]\n"
        "       python recipes/zppo.py --config YAML --dry_run     (check it, print the plan; trains nothing)"
    )
    by_dest: dict[str, list] = {}  # --flag and --no_flag share a dest
    for action in parser._actions:
        by_dest.setdefault(action.dest, []).append(action)
    ordered = []
    for title, names in groups:
        group = parser.add_argument_group(title)
        for name in [dest for dest in by_dest if dest in names]:
            for action in by_dest.pop(name):
                for container in parser._action_groups:
                    if action in container._group_actions:
                        container._group_actions.remove(action)
                group._group_actions.append(action)
        ordered.append(group)
    rest = [group for group in parser._action_groups if group not in ordered]
    for group in rest:
        if group.title == "options":
            group.title = "training (trl.GRPOConfig, transformers.TrainingArguments)"
    parser._action_groups[:] = ordered + rest  # argparse prints groups in this order
    return parser


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0]


def parse_recipe_args(argv: list[str]) -> tuple[ScriptArguments, ZPPOConfig, ModelConfig]:
    """The recipe's three argument objects from a command line (``--config YAML`` and overrides).

    A ``base:`` in the YAML is resolved first; a dry run (or ``--print_server_lengths``) on a machine
    without CUDA adds ``--use_cpu true`` so a GPU recipe validates here. A bad recipe, field or value
    (an unknown flag included) raises `RecipeError` with one line naming it; argparse's own errors (a flag
    without its value) exit with its usage line, as usual.
    """
    argv = list(argv)
    try:
        argv = resolve_base(argv)
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise RecipeError(_first_line(err)) from err
    if any(flag in argv for flag in ("--dry_run", "--print_server_lengths")) and "--use_cpu" not in argv:
        if not torch.cuda.is_available():  # validate a GPU recipe here: bf16 on CPU needs use_cpu
            argv += ["--use_cpu", "true"]
    try:
        script_args, args, model_args = build_parser().parse_args_and_config(argv)
    except (ValueError, TypeError) as err:  # a bad field or value: one line naming it, not a traceback
        raise RecipeError(_first_line(err)) from err
    if not model_args.model_name_or_path:
        raise RecipeError("model_name_or_path is required (the student, e.g. Qwen/Qwen3.5-0.8B)")
    if args.student_family is None:  # the paper's backbone students, named without reading their config
        args.student_family = backbone_family(model_args.model_name_or_path)
    return script_args, args, model_args


# ---------------------------------------------------------------------- the student and the rewards


def _hub_kwargs(model_args: ModelConfig) -> dict:
    return {
        "revision": model_args.model_revision,
        "trust_remote_code": getattr(model_args, "trust_remote_code", False),
    }


def student_config(model_args: ModelConfig, local_files_only: bool = False):
    """The student's `transformers` config (no weights); ``local_files_only`` reads only the local cache."""
    kwargs = _hub_kwargs(model_args)
    if local_files_only:
        kwargs["local_files_only"] = True
    return transformers.AutoConfig.from_pretrained(model_args.model_name_or_path, **kwargs)


def is_vision_language(config) -> bool:
    """Whether a `transformers` config has a vision tower (the student is then loaded as a VLM)."""
    return getattr(config, "vision_config", None) is not None


def load_student(model_args: ModelConfig):
    """The student model (VLM or causal LM, from its config) and its processor."""
    config = student_config(model_args)
    reason = unsupported_reason(config.model_type)
    if reason is not None:
        raise RecipeError(f"student {model_args.model_name_or_path} ({config.model_type}): {reason}")
    if is_vision_language(config):
        model_class = transformers.AutoModelForImageTextToText
    else:
        model_class = transformers.AutoModelForCausalLM
    kwargs = _hub_kwargs(model_args)
    if model_args.attn_implementation:
        kwargs["attn_implementation"] = model_args.attn_implementation
    if model_args.dtype not in (None, "auto"):
        kwargs["dtype"] = getattr(torch, model_args.dtype)
    model = model_class.from_pretrained(model_args.model_name_or_path, **kwargs)
    processor = load_processor(model_args.model_name_or_path, **_hub_kwargs(model_args))
    return model, processor


def reward_functions(script_args: ScriptArguments, args: ZPPOConfig) -> list:
    """The boxed grader, routed to the judge on zeros when a judge endpoint is configured."""
    if script_args.use_judge and args.judge_base_url and args.judge_model:
        return [judged_accuracy_reward(TeacherClient.from_config(args, role="judge"))]
    return [boxed_accuracy_reward]


# ---------------------------------------------------------------------- servers


def endpoints(script_args: ScriptArguments, args: ZPPOConfig) -> list[tuple[str, str, str]]:
    """(role, base_url, model) of every server the run talks to besides the student's vLLM: the teacher's where the
    row uses it (:attr:`zppo_trl.row.Row.uses_teacher_server`), the judge's where a part of the row judges
    (``Needs.judge``) or the reward does (``use_judge``); a judge on the teacher's server is listed once."""
    row = args.row
    out = []
    if row.uses_teacher_server:
        out.append(("teacher", args.teacher_base_url, args.teacher_model))
    judging = row.needs.judge or script_args.use_judge
    if judging and args.judge_base_url and args.judge_model:
        if not out or (args.judge_base_url, args.judge_model) != (out[0][1], out[0][2]):
            out.append(("judge", args.judge_base_url, args.judge_model))
    return out


WAIT_REPORT_S = 30.0  # while a server is awaited, a line this often saying what and for how long


def wait_for_servers(script_args: ScriptArguments, args: ZPPOConfig) -> None:
    """Block until the teacher/judge answer, or raise naming the field to fix; while one is awaited, a warning every
    :data:`WAIT_REPORT_S` seconds says which, for how long so far, and why it does not answer yet."""
    if script_args.teacher_wait_s <= 0:
        return
    for role, url, model in endpoints(script_args, args):
        client = TeacherClient(url, model, api_key_env=args.teacher_api_key_env, role=role)
        start = time.monotonic()
        deadline, report = start + script_args.teacher_wait_s, start + WAIT_REPORT_S
        try:
            while (reason := client.unhealthy_reason(timeout=10.0)) is not None:
                now = time.monotonic()
                if now > deadline:
                    fields = f"{role}_base_url / {role}_model"
                    raise SystemExit(
                        f"the {role} at {url} (model {model!r}) did not answer within "
                        f"teacher_wait_s={script_args.teacher_wait_s:g} s ({reason}); start it (recipes/launch/) or "
                        f"fix {fields}"
                    )
                if now >= report:
                    logger.warning(
                        "still waiting for the %s at %s (model %s): %.0f s of teacher_wait_s=%g s (%s)",
                        role, url, model, now - start, script_args.teacher_wait_s, reason,
                    )  # fmt: skip
                    report = now + WAIT_REPORT_S
                time.sleep(min(5.0, WAIT_REPORT_S, max(0.1, deadline - now)))  # no longer than teacher_wait_s asks
        finally:
            client.close()
        logger.info("%s at %s is up (model %s)", role, url, model)


def release_distributed(accelerator) -> None:
    """End a run's distributed state so that every rank exits cleanly: drop the accelerator's references to the
    wrapped model (DDP, DeepSpeed) and collect it, then destroy the process group (``Accelerator.end_training``).

    The order matters on gloo. DDP's reducer holds the process group, and a group freed by the reducer joins its
    worker threads with the GIL held (pybind frees the reducer without releasing it), while a worker finishing a
    collective needs the GIL to free that collective's tensors: a rank then hangs after its last line (seen in
    2-process CPU runs, about one run in two). Freed while the group's registry still holds it, the reducer
    only drops a reference; ``destroy_process_group`` then frees the group itself, through torch's binding
    that releases the GIL first. The caller must hold no reference to the trainer or the wrapped model.
    """
    accelerator.free_memory()  # the accelerator's own references; garbage-collects the trainer's cycles
    accelerator.end_training()
