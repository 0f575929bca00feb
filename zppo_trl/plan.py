"""The dry run of a recipe: the plan (what one step holds, the process layout, the servers and
their context sizes) and the checks that need no weights (the student's and a distillation
teacher's configs, every row of a local dataset, the teacher and judge servers, the output
folder).

``python recipes/zppo.py --config YAML --dry_run`` prints it; `dry_run` is the same from Python::

    from zppo_trl.plan import dry_run
    from zppo_trl.recipe import parse_recipe_args

    exit_code = dry_run(*parse_recipe_args(["--config", "recipes/qwen35_0.8b.yaml", "--dry_run"]))

The Hugging Face Hub is asked at most once: when a Hub id is to be checked, one short probe
(`probe_hub`) decides, and where the Hub is unreachable (or ``HF_HUB_OFFLINE`` is set) the
configs are read from the local cache only, with one line saying so, instead of a retry loop per file.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import huggingface_hub
import transformers
from huggingface_hub.utils import get_session
from trl import ModelConfig

from .backbones import known_model_type, unsupported_reason
from .checkpoint_state import last_complete_checkpoint
from .config import ZPPOConfig
from .data import is_hub_id, load_questions
from .memory_plan import (
    GPU_BYTES,
    GPU_RESERVED,
    GiB,
    activation_bytes,
    architecture,
    format_padding,
    format_plan,
    known_student_config,
    optimizer_state,
    packing_refusal,
    padding_plan,
    plan_memory,
    update_shape,
)
from .needs import COPY_EMA, SCORES_TOKEN_LOGPS, SCORES_TOP_K
from .recipe import ScriptArguments, endpoints, is_vision_language, student_config
from .storage_plan import checkpoint_size, checkpoints_kept, storage_lines
from .teacher import TeacherClient

__all__ = [
    "HubStatus",
    "dry_run",
    "generation_backend",
    "print_checks",
    "print_memory_plan",
    "print_plan",
    "probe_hub",
]

_TRUE = {"1", "on", "yes", "true"}


def generation_backend(args: ZPPOConfig) -> str:
    """Where the student's rollouts are generated, in words."""
    if not args.use_vllm:
        return "transformers generate on each training rank (use_vllm: false)"
    if args.vllm_mode == "server":
        url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        return f"vLLM server at {url} (start it with recipes/launch/serve_student.sh: `vllm serve` with TRL's flags)"
    return f"vLLM colocated on each training rank (tensor parallel {args.vllm_tensor_parallel_size})"


# ---------------------------------------------------------------------- the Hub, asked once


@dataclass(frozen=True)
class HubStatus:
    """Whether the dry run may ask the Hub; when not, `line` is the one line of the checks that says why."""

    offline: bool
    line: str = ""


def probe_hub(timeout: float = 3.0) -> HubStatus:
    """One request to the Hub's endpoint (``HF_ENDPOINT``), or none when ``HF_HUB_OFFLINE`` (or
    ``TRANSFORMERS_OFFLINE``) is set. Any answer below 500 counts as reachable; no answer within
    ``timeout`` seconds, a failed connection or a server error counts as unreachable."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    if any(os.environ.get(name, "").strip().lower() in _TRUE for name in names) or huggingface_hub.is_offline_mode():
        return HubStatus(True, "  skip  Hugging Face Hub: HF_HUB_OFFLINE is set; Hub ids from the local cache only")
    endpoint = huggingface_hub.constants.ENDPOINT
    try:
        status = get_session().head(endpoint, timeout=timeout).status_code
        reason = f"HTTP {status}" if status >= 500 else ""
    except Exception as err:  # noqa: BLE001 - any failure to connect means: do not ask again
        lines = str(err).strip().splitlines()
        reason = f"{type(err).__name__}: {lines[0][:80]}" if lines else type(err).__name__
    if not reason:
        return HubStatus(False)
    return HubStatus(
        True,
        f"  down  Hugging Face Hub at {endpoint} (not reachable now: {reason}); "
        "the rest of this dry run is offline (HF_HUB_OFFLINE=1: Hub ids from the local cache only)",
    )


# ---------------------------------------------------------------------- the plan and the checks


def teacher_lines(args: ZPPOConfig) -> list[str]:
    """The dry run's teacher lines, from the row's needs (:attr:`ZPPOConfig.row`): the server and what the row asks
    of it, the teacher loaded next to the student and what it scores, or none."""
    row = args.row
    needs = row.needs
    scores = {
        SCORES_TOP_K: f"its top-{args.distill_top_k} log-probs at each completion token",
        SCORES_TOKEN_LOGPS: "its log-prob of each sampled token",
    }
    uses = []
    if needs.teacher_samples:
        uses.append(f"G_T={args.teacher_num_generations}")
    uses += [use for description in row.describe(args) for use in description.teacher_use]
    lines = []
    if row.uses_teacher_server:
        uses += [f"{scores[s]} (prompt_logprobs)" for s in sorted(row.teacher_scores_from_server)]
        lines.append(f"  teacher: {args.teacher_model} at {args.teacher_base_url} ({', '.join(uses)})")
    if row.loads_teacher:
        scored = "; ".join(scores[s] for s in sorted(needs.teacher_scores))
        lines.append(f"  teacher: {args.distill_teacher}, loaded next to the student on every rank ({scored})")
    return lines or ["  teacher: none"]


def print_plan(script_args: ScriptArguments, args: ZPPOConfig, out: Callable[[str], object] = print) -> None:
    """The headline, the step composition and the process layout; reads no file and asks no server."""
    launched = args.world_size
    ranks = script_args.num_training_ranks or launched
    composition = args.composition(ranks)
    out(f"ZPPO dry run: {args.variant}")
    out(str(composition))

    out("\nprocess layout:")
    note = "" if ranks == launched else f" (this launch has {launched}; planned for num_training_ranks)"
    out(f"  training ranks: {ranks}{note}")
    rows = args.per_device_train_batch_size * args.steps_per_generation
    out(
        f"  per rank: {rows} rows per rollout step ({rows // args.num_generations} new prompt groups); "
        f"micro-batches of {composition.rows_per_micro_batch} rows x {composition.micro_batches_per_update} "
        "per update (replayed and reformulated groups add rows)"
    )
    out(f"  per-step cap: <= {composition.max_prompts} prompt groups (new + replayed + reformulated)")
    out(f"  student rollouts: {generation_backend(args)}")
    row = args.row
    for line in teacher_lines(args):
        out(line)
    for description in row.describe(args):
        for line in description.plan:
            out(line)
    judging = (script_args.use_judge or row.needs.judge) and args.judge_base_url and args.judge_model
    out(f"  judge: {f'{args.judge_model} at {args.judge_base_url}' if judging else 'off (boxed grader only)'}")
    if composition.rollout_steps is not None:
        draws = composition.rollout_steps * composition.new_prompts
        passes = f" ({args.corpus_passes} corpus passes)" if args.corpus_passes != 1 else ""
        out(
            f"  schedule: {composition.rollout_steps} rollout steps = {args.max_steps} optimizer updates = "
            f"{draws:,} new-prompt draws{passes}"
        )
    precision = "bf16" if args.bf16 else "fp32"
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    completion = args.max_completion_length
    out(f"  precision: {precision}; lr {args.learning_rate:g} {schedule}; max completion {completion} tokens")
    out(f"  server context: {args.context_lengths()}")
    if args.use_vllm and args.vllm_max_model_length < args.context_lengths().student:
        out(
            f"        vllm_max_model_length={args.vllm_max_model_length} is smaller: BCQ/NCQ rollouts can be cut short"
        )


def print_checks(
    script_args: ScriptArguments,
    args: ZPPOConfig,
    model_args: ModelConfig,
    out: Callable[[str], object] = print,
    hub: HubStatus | None = None,
) -> list[str]:
    """Check what can be checked without weights, one line each; returns the problems (empty: ok).

    ``hub`` is the Hub's status when already known; by default `probe_hub` asks once, and only when a
    Hub id is to be checked.
    """
    problems: list[str] = []
    out("\nchecks:")
    hub = _hub_status(args, model_args, hub)
    local_only = hub is not None and hub.offline
    if local_only:
        out(hub.line)
    # model: config only
    model_type = known_model_type(model_args.model_name_or_path)  # the paper's backbones, known offline
    try:
        config = student_config(model_args, local_files_only=local_only)
        model_type = config.model_type
        kind = "vision-language" if is_vision_language(config) else "text"
        if unsupported_reason(model_type) is None:
            out(f"  ok    student {model_args.model_name_or_path}: {config.model_type} ({kind})")
    except Exception as err:  # noqa: BLE001 - reported, not raised: a dry run lists every problem
        if not is_hub_id(model_args.model_name_or_path):
            problems.append(f"student {model_args.model_name_or_path}: {err}")
            out(f"  FAIL  student {model_args.model_name_or_path}: {err}")
        elif unsupported_reason(model_type) is None:
            reason = f"{type(err).__name__}: {str(err).splitlines()[0][:100]}"
            out(f"  skip  student {model_args.model_name_or_path}: config not reachable here ({reason})")
    if unsupported_reason(model_type) is not None:  # a family this project cannot train (zppo_trl.backbones)
        problems.append(f"student {model_args.model_name_or_path}: {unsupported_reason(model_type)}")
        out(f"  FAIL  student {model_args.model_name_or_path} ({model_type}): {unsupported_reason(model_type)}")
    if args.row.loads_teacher:  # the teacher loaded next to the student: its config only
        try:
            offline = {"local_files_only": True} if local_only else {}
            transformers.AutoConfig.from_pretrained(args.distill_teacher, **offline)
            out(f"  ok    distill_teacher {args.distill_teacher}")
        except Exception as err:  # noqa: BLE001 - reported, not raised
            if not is_hub_id(args.distill_teacher):
                reason = err if os.path.exists(args.distill_teacher) else "no such directory"
                problems.append(f"distill_teacher {args.distill_teacher}: {reason}")
                out(f"  FAIL  distill_teacher {args.distill_teacher}: {reason}")
            else:
                reason = type(err).__name__
                out(f"  skip  distill_teacher {args.distill_teacher}: config not reachable here ({reason})")
    # dataset: every row when local
    if not is_hub_id(script_args.dataset_name):  # a local path, existing or not (see zppo_trl.data.is_hub_id)
        try:
            dataset, skipped = load_questions(
                script_args.dataset_name, script_args.dataset_split, skip_invalid=script_args.skip_invalid
            )
            extra = f", {len(skipped)} invalid rows would be skipped" if skipped else ""
            out(f"  ok    dataset {script_args.dataset_name}: {len(dataset):,} valid rows{extra}")
            composition = args.composition(script_args.num_training_ranks or args.world_size)
            if composition.rollout_steps is not None:
                draws = composition.rollout_steps * composition.new_prompts
                if draws > len(dataset):
                    out(f"        ({draws:,} draws is {draws / len(dataset):.2f} epochs of it)")
                passes = args.corpus_passes
                if passes > 1 and round(draws / len(dataset)) != passes:  # the row's name would say otherwise
                    problem = (
                        f"corpus_passes={passes}, but the schedule's {draws:,} draws are "
                        f"{draws / len(dataset):.2f} passes of {script_args.dataset_name}"
                    )
                    problems.append(problem)
                    out(f"  FAIL  {problem}")
        except Exception as err:  # noqa: BLE001
            problems.append(f"dataset {script_args.dataset_name}: {err}")
            out(f"  FAIL  dataset {script_args.dataset_name}: {err}")
    else:
        name = script_args.dataset_name
        out(f"  skip  dataset {name}: a Hub id (org/name); rows are validated when the run loads it")
    # servers
    for role, url, model in endpoints(script_args, args):
        client = TeacherClient(url, model, api_key_env=args.teacher_api_key_env, max_retries=0)
        healthy = client.health(timeout=5.0)
        client.close()
        state = "ok  " if healthy else "down"
        out(f"  {state}  {role} {model} at {url}{'' if healthy else ' (not reachable now; start it before training)'}")
    last = last_complete_checkpoint(args.output_dir)
    out(f"  ok    output_dir {args.output_dir}: {'resumes from ' + last if last else 'starts fresh'}")
    if args.push_to_hub:
        target, strategy = args.hub_model_id, args.hub_strategy
        out(f"  ok    pushes checkpoints and the final model to {target} (hub_strategy {strategy})")
    return problems


def _hub_status(args: ZPPOConfig, model_args: ModelConfig, hub: HubStatus | None) -> HubStatus | None:
    """``hub``, or the Hub probed once when a model to be checked is a Hub id (None: nothing to ask it)."""
    hub_ids = [model_args.model_name_or_path] + ([args.distill_teacher] if args.row.loads_teacher else [])
    if hub is None and any(is_hub_id(name) for name in hub_ids):
        hub = probe_hub()
    return hub


def print_memory_plan(
    script_args: ScriptArguments,
    args: ZPPOConfig,
    model_args: ModelConfig,
    out: Callable[[str], object] = print,
    hub: HubStatus | None = None,
) -> None:
    """The memory of one student training rank during an update (:mod:`zppo_trl.memory_plan`), from the
    student's config where it can be read, else from the paper's students' known architectures."""
    name = model_args.model_name_or_path
    hub = _hub_status(args, model_args, hub)
    try:
        config, source = student_config(model_args, local_files_only=hub is not None and hub.offline), "its config"
    except Exception:  # noqa: BLE001 - the checks above report an unreadable config
        config, source = known_student_config(name), "the architecture zppo_trl.memory_plan knows for it"
    if config is None:
        out(
            f"\nmemory plan: skipped (the config of {name} cannot be read here, and it is not one of the paper's "
            "students)"
        )
        return
    ranks = script_args.num_training_ranks or args.world_size
    shape = update_shape(args)
    arch = architecture(config)
    plan = plan_memory(
        arch,
        shape,
        ranks,
        optimizer_state_bytes=optimizer_state(args),
        gradient_checkpointing=args.gradient_checkpointing,
        fused_head=args.fused_lm_head,
    )
    beside, whole = _beside_student(args, arch.parameters, ranks, hub)
    plan = dataclasses.replace(plan, lines=plan.lines + tuple(beside))
    format_plan(plan, shape, ranks, out)
    out(f"  (the student {name}: {arch.parameters / 1e9:.2f}B parameters, from {source})")
    if whole:  # what ZeRO-2 or DDP (the launch scripts' default) holds whole on every rank instead of sharded
        total = plan.total() + whole
        verdict = "fits" if total <= GPU_BYTES - GPU_RESERVED else "would not fit"
        out(
            f"  under ZeRO-2 or DDP (the launch scripts' default) distill_teacher is whole on every rank: "
            f"+{whole / GiB:.1f} GiB, {total / GiB:.1f} GiB in all: {verdict} an 80 GB H100"
        )
    # padded against packed tokens per micro-batch (zppo_trl.packing decides whether this student packs)
    refusal = packing_refusal(config, model_args.attn_implementation or arch.attention)
    per_token = activation_bytes(arch, 1, gradient_checkpointing=args.gradient_checkpointing)
    format_padding(padding_plan(args, refusal), per_token, out)
    # what the checkpoints take on disk, against the free space of output_dir's filesystem (zppo_trl.storage_plan)
    size = checkpoint_size(arch.parameters, args, model_args.dtype)
    for line in storage_lines(size, checkpoints_kept(args), args):
        out(line)


def _parameters_of(name: str, hub: HubStatus | None) -> tuple[int | None, str]:
    """A model's parameter count and where it came from: its config, or its name ("...-27B"); None if neither."""
    try:
        offline = {"local_files_only": True} if hub is not None and hub.offline else {}
        return architecture(transformers.AutoConfig.from_pretrained(name, **offline)).parameters, "its config"
    except Exception:  # noqa: BLE001 - unreadable here: read the size from the name
        found = re.search(r"(\d+(?:\.\d+)?)B(?![a-z])", name.rsplit("/", 1)[-1])
        if found is None:
            return None, "unknown"
        return int(float(found.group(1)) * 1e9), "its name"


def _beside_student(
    args: ZPPOConfig, student_parameters: int, ranks: int, hub: HubStatus | None
) -> tuple[list[tuple[str, int]], int]:
    """The memory-plan lines of every model the row keeps next to the student on each rank (from the row's needs:
    ``distill_teacher``, the copies of the student), in the plan's FSDP layout; and the bytes a layout that does not
    shard them (ZeRO-2, DDP) adds on top."""
    row, lines, whole = args.row, [], 0
    if row.loads_teacher:
        parameters, source = _parameters_of(args.distill_teacher, hub)
        if parameters is None:
            lines.append((f"distill_teacher {args.distill_teacher}: size unknown here, not counted", 0))
        else:
            size = 2 * parameters  # loaded in the student's dtype: bf16
            lines.append(
                (
                    f"distill_teacher {args.distill_teacher} (bf16, {parameters / 1e9:.1f}B parameters from {source}; "
                    f"FSDP shard of {ranks})",
                    size // ranks,
                )
            )
            whole += size - size // ranks
    for kind in row.needs.student_copy_kinds:  # FSDP and ZeRO-3 refuse these rows: never sharded
        what = "an EMA copy" if kind == COPY_EMA else "a frozen copy"
        lines.append(
            (f"{what} of the student (float32, whole on every rank: ZeRO-2 or DDP only)", 4 * student_parameters)
        )
    return lines, whole


def dry_run(
    script_args: ScriptArguments,
    args: ZPPOConfig,
    model_args: ModelConfig,
    out: Callable[[str], object] = print,
    hub: HubStatus | None = None,
) -> int:
    """Validate what can be validated without weights and print the plan. Returns an exit code (0 ok, 1 problems)."""
    print_plan(script_args, args, out)
    hub = _hub_status(args, model_args, hub)
    problems = print_checks(script_args, args, model_args, out, hub)
    print_memory_plan(script_args, args, model_args, out, hub)
    if problems:
        out(f"\n{len(problems)} problem(s); nothing was trained.")
        return 1
    out("\ndry run ok; nothing was trained.")
    return 0
