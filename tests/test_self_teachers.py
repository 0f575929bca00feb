"""The self-teacher rows SDPO† and OPSD† (the paper's teacher-side table): the privileged context each rollout's
self-teacher sees, its prompt, each named term on hand-computed values, and the configuration that selects it.

Written out independently of the code (minimize form, N the update's token count, A the rollout's advantage,
r = pi / pi_old, d = log pi - log pi_T the gap to the self-teacher at the sampled token, m the self-teacher mask):
``-(1/N) sum_t min(r A, clip(r) A) + (1/N) sum_t m_t min(r_t, 2) d_t log pi_t`` with ``d`` and ``min(r, 2)``
held constant, so a token's gradient with respect to its own log pi is ``(-r A + m min(r, 2) d) / N`` inside the
clip.
"""

from __future__ import annotations

import math

import pytest
import torch

from zppo_trl import ZPPOConfig
from zppo_trl.batches import concat_batches
from zppo_trl.distill import DistillInputs, TeacherTopK, top_k_logps
from zppo_trl.losses import LossInputs
from zppo_trl.objectives import loss_for, objective_terms
from zppo_trl.terms import TERMS
from zppo_trl.terms.self_teachers import (
    OPSD,
    SDPO,
    SELF_TEACHERS,
    opsd_context,
    opsd_loss,
    sdpo_context,
    sdpo_demonstrations,
    sdpo_loss,
    self_distillation_per_token,
)

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from loss_fixtures import CPU, loss_args, response_inputs
    from settings import UNREACHABLE_TEACHER
except ImportError:
    from tests.loss_fixtures import CPU, loss_args, response_inputs
    from tests.settings import UNREACHABLE_TEACHER


def _args(**overrides):
    """The paper's clip settings and the term's defaults, written out."""
    return loss_args(**{"self_distill_weight": 1.0, "sdpo_is_clip": 2.0, **overrides})


def test_each_rollout_learns_from_the_first_other_correct_rollout_of_its_group():
    correct = [False, True, False, True] + [True, False, False, False] + [False] * 4
    assert sdpo_demonstrations(correct, 4) == [1, 3, 1, 1] + [None, 4, 4, 4] + [None] * 4
    # a correct rollout alone in its group has no demonstration: never itself
    assert sdpo_demonstrations([True, False], 2) == [None, 0]
    with pytest.raises(ValueError, match="do not form groups of 4"):
        sdpo_demonstrations([True] * 6, 4)


def test_the_self_teachers_prompt_is_sdpos_official_template_around_the_demonstration():
    prompt = "What is 6 x 7?\nPut the final answer in \\boxed{}."
    demonstration = "<think>six sevens</think>\n6 x 7 = 42, so \\boxed{42}.\n"
    assert sdpo_context(prompt, demonstration) == (
        "What is 6 x 7?\nPut the final answer in \\boxed{}."
        "\nCorrect solution:\n\n6 x 7 = 42, so \\boxed{42}."
        "\n\nCorrectly solve the original question."
    )


def test_the_term_is_the_sampled_token_reverse_kl_weighted_by_the_capped_ratio():
    logps = torch.tensor([math.log(0.5), math.log(0.5)], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([math.log(0.25), math.log(0.5)], dtype=torch.float64)
    old = torch.tensor([math.log(0.1), math.log(0.4)], dtype=torch.float64)  # r = 5 (capped at 2), r = 1.25
    per_token = self_distillation_per_token(logps, teacher, old, 2.0)
    expected = [2.0 * math.log(2) * math.log(0.5), 1.25 * 0.0 * math.log(0.5)]
    assert per_token.tolist() == pytest.approx(expected, rel=1e-12)
    per_token.sum().backward()
    assert logps.grad.tolist() == pytest.approx([2.0 * math.log(2), 0.0], rel=1e-12)
    unclipped = self_distillation_per_token(logps.detach(), teacher, old, None)
    assert unclipped.tolist() == pytest.approx([math.log(2) * math.log(0.5), 0.0], rel=1e-12)


def test_sdpo_is_grpo_plus_the_term_on_the_rollouts_with_a_self_teacher():
    # on-policy (r = 1): GRPO's part is -A per token. Tokens 0-2 have a self-teacher (half as likely, as likely,
    # twice as likely); token 3 has none (mask 0); token 4 is padding and must not count at all
    p = [0.5, 0.25, 0.125, 0.6, 0.9]
    pt = [0.25, 0.25, 0.25, 0.01, 0.01]
    logp, logt = [math.log(x) for x in p], [math.log(x) for x in pt]
    A, N = 0.7, 4
    inputs = response_inputs(logp, logp, logt, [A], [1, 1, 1, 1, 0], teacher_mask=[1, 1, 1, 0, 1])
    out = sdpo_loss(inputs, _args(self_distill_weight=0.5))
    d = [math.log(2), 0.0, -math.log(2)]
    assert out.loss.item() == pytest.approx(-A + 0.5 * sum(x * lp for x, lp in zip(d, logp)) / N, rel=1e-12)
    out.loss.backward()
    expected_grad = [(-A + 0.5 * x) / N for x in d] + [-A / N, 0.0]
    assert inputs.logps.grad[0].tolist() == pytest.approx(expected_grad, rel=1e-12, abs=1e-15)
    total, count = out.means["self_distill/log_ratio"]
    assert float(count) == 3 and float(total) == pytest.approx(0.0, abs=1e-12)
    reached, tokens = out.means["self_distill/tokens"]
    assert (float(reached), float(tokens)) == (3.0, 4.0)


def test_sdpo_keeps_grpos_clip_and_the_term_its_own_cap():
    # token 0 at r = 1.5 with A > 0: GRPO's part is clipped (no gradient); the term pushes it with min(1.5, 2) d
    logp, old, teacher = [math.log(0.6)], [math.log(0.4)], [math.log(0.3)]
    inputs = response_inputs(logp, old, teacher, [1.0], [1], teacher_mask=[1])
    out = sdpo_loss(inputs, _args())
    assert out.loss.item() == pytest.approx(-1.28 + 1.5 * math.log(2) * math.log(0.6), rel=1e-12)
    out.loss.backward()
    assert float(inputs.logps.grad[0, 0]) == pytest.approx(1.5 * math.log(2), rel=1e-12)


def test_a_batch_without_the_self_teachers_signal_trains_grpo_alone():
    inputs = response_inputs([-1.0], [-1.0], [-2.0], [1.0], [1], teacher_mask=[1])
    inputs.teacher_logps = inputs.teacher_mask = None  # TRL's evaluation batches
    assert sdpo_loss(inputs, _args()).loss.item() == pytest.approx(-1.0)


def test_rounds_without_the_self_teachers_fields_merge_as_rows_without_a_teacher():
    def batch(rows: int, teacher: bool) -> dict:
        out = {
            "prompt_ids": torch.ones(rows, 2, dtype=torch.long),
            "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
            "completion_ids": torch.ones(rows, 3, dtype=torch.long),
            "completion_mask": torch.ones(rows, 3, dtype=torch.long),
            "advantages": torch.zeros(rows),
        }
        if teacher:
            out["self_teacher_logps"] = torch.full((rows, 3), -0.5)
            out["self_teacher_mask"] = torch.ones(rows, 3, dtype=torch.long)
        return out

    merged = concat_batches([batch(2, True), batch(1, False)], pad_token_id=0)
    assert merged["self_teacher_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 0]]
    assert merged["self_teacher_logps"][:2].eq(-0.5).all() and merged["self_teacher_logps"][2].eq(0).all()
    with pytest.raises(ValueError, match="'old_per_token_logps' is present in some rounds"):
        concat_batches([{**batch(1, False), "old_per_token_logps": torch.zeros(1, 3)}, batch(1, False)], 0)


def test_sdpo_is_a_registered_objective_named_as_the_papers_table():
    config = ZPPOConfig(policy_objective="sdpo", **CPU)
    assert config.variant == "SDPO\u2020"
    loss = loss_for(config)
    assert loss.trains_zero_advantage and not loss.needs_teacher_logps and config.row.terms == (SDPO,)
    assert not config.row.uses_teacher  # no external teacher: the row needs no server
    # one registry answers policy_objective: the objective carries its term, no term registry holds it
    assert loss.term is SDPO and SDPO not in TERMS.values() and OPSD not in TERMS.values()
    assert objective_terms() == {"sdpo": SDPO, "opsd": OPSD}
    assert (config.self_distill_weight, config.sdpo_teacher_update_rate, config.sdpo_is_clip) == (1.0, 0.05, 2.0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(sdpo_teacher_update_rate=1.5), "sdpo_teacher_update_rate must be a finite number in"),
        (dict(self_distill_weight=-1.0), "self_distill_weight must be a finite number"),
        (dict(sdpo_is_clip=0.0), "sdpo_is_clip must be a finite number > 0"),
        (
            dict(augmentations=["bcq"], **UNREACHABLE_TEACHER),
            "policy_objective='sdpo' is a row on GRPO\u2020's pipeline",
        ),
    ],
)
def test_bad_settings_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        ZPPOConfig(**{**CPU, "policy_objective": "sdpo", **overrides})


def test_its_settings_on_another_row_warn_that_nothing_reads_them():
    with pytest.warns(UserWarning, match="sdpo_is_clip=3.0 has no effect on this row .*only policy_objective: sdpo"):
        ZPPOConfig(sdpo_is_clip=3.0, **CPU)


def _every_other_rollout_right(completions, **kwargs):
    """Rollouts 1 and 3 of each group of 4 are 'correct': every rollout has a correct sibling to learn from."""
    return [float(n % 2) for n in range(len(completions))]


def test_the_self_teacher_scores_image_rollouts_after_its_prompt_with_the_same_image(tmp_path):
    """A tiny random Qwen3.5 VLM, one SDPO† rollout step: the self-teacher's log-probs of every sampled token equal
    an independent forward of the initial weights on the processor's chat-templated self-teacher prompt (its image
    included) followed by the completion."""
    from datasets import Dataset

    from zppo_trl import ZPPOTrainer

    try:
        from boxed_models import toy_rows
        from tiny_models import tiny_processor, tiny_vlm
    except ImportError:
        from tests.boxed_models import toy_rows
        from tests.tiny_models import tiny_processor, tiny_vlm

    model, processor = tiny_vlm(seed=0), tiny_processor()
    initial = tiny_vlm(seed=0)
    args = ZPPOConfig(
        **{**CPU, "output_dir": str(tmp_path / "out")},
        policy_objective="sdpo",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        num_partitions=1,
        max_steps=1,
        replay_fraction=0.0,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    trainer = ZPPOTrainer(
        model=model,
        reward_funcs=_every_other_rollout_right,
        args=args,
        train_dataset=Dataset.from_list(toy_rows("vlm")),
        processing_class=processor,
    )
    seen = []
    (term,) = trainer.terms
    scored = term.signal

    def recorded(batch, rows, conversations):
        fields = scored(batch, rows, conversations)
        seen.append((batch, list(rows), conversations, fields["self_teacher_logps"][rows]))
        return fields

    term.signal = recorded
    trainer.train()
    ((batch, rows, conversations, logps),) = seen
    assert rows == list(range(batch["completion_ids"].size(0)))  # every rollout has a correct sibling
    for k, row in enumerate(rows):
        parts = conversations[k][-1]["content"]
        assert [p["type"] for p in parts] == ["image", "text"] and "\nCorrect solution:\n\n" in parts[1]["text"]
        inputs = processor.apply_chat_template(
            conversations[k], add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
        completion = batch["completion_ids"][row][batch["completion_mask"][row].bool()]
        ids = torch.cat([inputs["input_ids"][0], completion])[None]
        extra = {name: inputs[name] for name in ("pixel_values", "image_grid_thw") if name in inputs}
        if "mm_token_type_ids" in inputs:
            types = inputs["mm_token_type_ids"][0]
            extra["mm_token_type_ids"] = torch.cat([types, torch.zeros_like(completion)])[None]
        with torch.no_grad():
            logits = initial(input_ids=ids, **extra).logits[0, inputs["input_ids"].size(1) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, completion[:, None]).squeeze(-1)
        torch.testing.assert_close(logps[k, : completion.numel()], expected, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------- OPSD


def test_the_opsd_self_teachers_prompt_puts_opsds_reference_block_between_question_and_closer():
    reference = "<think>draft</think>\n6 x 7 = 42.\n\\boxed{42}\n"
    assert opsd_context("What is 6 x 7?", reference, "Put the final answer in \\boxed{}.") == (
        "What is 6 x 7?\n\n"
        "Here is a reference solution to this problem:\n=== Reference Solution Begin ===\n6 x 7 = 42.\n\\boxed{42}\n"
        "=== Reference Solution End ===\n\n"
        "After reading the reference solution above, make sure you truly understand the reasoning behind each step "
        "\u2014 do not copy or paraphrase it. Now, using your own words and independent reasoning, derive the same "
        "final answer to the problem above. Think step by step, explore different approaches, and don't be afraid "
        "to backtrack or reconsider if something doesn't work out:\n\n"
        "Put the final answer in \\boxed{}."
    )
    with pytest.raises(ValueError, match="non-empty solution"):
        opsd_context("Q", "<think>only a draft</think>  ", None)


def test_top_k_logps_are_the_k_largest_log_probs_in_rank_order():
    torch.manual_seed(0)
    states, head = torch.randn(2, 3, 4), torch.nn.Linear(4, 7, bias=False)
    topk = top_k_logps(states, head, vocab=6, k=3, chunk_size=2)  # the head's 7th logit is past the vocabulary
    full = torch.log_softmax(head(states)[..., :6].float(), dim=-1)
    expected = full.topk(3, dim=-1)
    assert topk.ids.shape == (2, 3, 3) and torch.equal(topk.ids, expected.indices)
    torch.testing.assert_close(topk.logps, expected.values)


def _kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def test_opsd_is_grpo_plus_the_jsd_to_the_self_teachers_top_k_with_its_tail():
    # a 3-token vocabulary, the self-teacher's top 2 (plus the tail bucket): at each of two positions the student's
    # distribution is softmax(logits); position 1 has no self-teacher (mask 0) and must not count
    logits = torch.tensor([[[1.0, 0.0, -1.0], [0.5, 0.5, 0.0]]], dtype=torch.float64)
    states = logits.clone().requires_grad_(True)  # the head is the identity: states are the logits
    topk = TeacherTopK(
        torch.tensor([[[2, 0], [0, 1]]]),
        torch.tensor([[[math.log(0.6), math.log(0.3)], [math.log(0.5), math.log(0.4)]]], dtype=torch.float64),
    )
    A, N, weight = 0.5, 2, 0.25
    logps = torch.log_softmax(states, -1).gather(-1, torch.tensor([[[0], [1]]])).squeeze(-1)
    inputs = LossInputs(
        mask=torch.ones(1, 2, dtype=torch.float64),
        normalizer=float(N),
        logps=logps,
        old_logps=logps.detach(),
        advantages=torch.tensor([A], dtype=torch.float64),
        entropies=torch.zeros(1, 2, dtype=torch.float64),
        teacher_mask=torch.tensor([[1.0, 0.0]], dtype=torch.float64),
        distill=DistillInputs(states, lambda x: x, 3, topk=topk),
    )
    out = opsd_loss(inputs, _args(self_distill_weight=weight, opsd_beta=0.5, distill_chunk_size=8))
    p = torch.softmax(logits[0, 0], -1).tolist()
    student = [p[2], p[0], 1 - p[2] - p[0]]  # on the teacher's support: its top 2, then the rest
    teacher = [0.6, 0.3, 0.1]
    mixture = [0.5 * s + 0.5 * t for s, t in zip(student, teacher)]
    jsd = 0.5 * _kl(teacher, mixture) + 0.5 * _kl(student, mixture)
    assert out.loss.item() == pytest.approx(-A + weight * jsd / N, rel=1e-9)
    total, count = out.means["self_distill/jsd"]
    assert float(count) == 1 and float(total) == pytest.approx(jsd, rel=1e-9)
    forward = opsd_loss(inputs, _args(self_distill_weight=weight, opsd_beta=0.0, distill_chunk_size=8))
    assert forward.loss.item() == pytest.approx(-A + weight * _kl(teacher, student) / N, rel=1e-9)


def test_rounds_without_opsds_top_k_merge_as_rows_without_a_teacher():
    def batch(rows: int, k: int | None) -> dict:
        out = {
            "prompt_ids": torch.ones(rows, 2, dtype=torch.long),
            "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
            "completion_ids": torch.ones(rows, 2 if k else 4, dtype=torch.long),
            "completion_mask": torch.ones(rows, 2 if k else 4, dtype=torch.long),
            "advantages": torch.zeros(rows),
        }
        if k:
            out["self_teacher_topk_ids"] = torch.full((rows, 2, k), 5)
            out["self_teacher_topk_logps"] = torch.full((rows, 2, k), -0.5)
        return out

    merged = concat_batches([batch(1, 3), batch(1, None)], pad_token_id=0)
    assert merged["self_teacher_topk_ids"].shape == (2, 4, 3)  # padded along the positions, the top-k kept
    assert merged["self_teacher_topk_ids"][0, :2].eq(5).all() and merged["self_teacher_topk_ids"][0, 2:].eq(0).all()
    assert merged["self_teacher_topk_logps"][1].eq(0).all()


def test_opsd_is_a_registered_objective_that_needs_the_teacher_server():
    teacher = UNREACHABLE_TEACHER
    config = ZPPOConfig(policy_objective="opsd", **teacher, **CPU)
    assert config.variant == "OPSD\u2020" and config.row.terms == (OPSD,)
    assert (config.opsd_beta, config.opsd_top_k, config.self_distill_weight) == (0.5, 20, 1.0)
    assert OPSD.needs.teacher_samples and not SELF_TEACHERS["opsd"].moves
    assert not SDPO.needs.teacher_samples and SELF_TEACHERS["sdpo"].moves
    with pytest.raises(ValueError, match="set teacher_base_url and teacher_model"):
        ZPPOConfig(policy_objective="opsd", **CPU)
    with pytest.raises(ValueError, match="opsd_top_k must be an integer >= 1"):
        ZPPOConfig(policy_objective="opsd", opsd_top_k=0, **teacher, **CPU)
    with pytest.warns(UserWarning, match="opsd_beta=0.0 has no effect .*only policy_objective: opsd"):
        ZPPOConfig(policy_objective="sdpo", opsd_beta=0.0, **CPU)
