"""The distillation rows' divergence (zppo_trl.distill): the chunked JSD against GKD's own formula, its
top-k form against the full one, and its gradients, on small hand-made tensors.

tests/test_comparison_rows.py trains the rows themselves, against a local teacher and against the teacher's
real vLLM server.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from zppo_trl.distill import DistillInputs, TeacherTopK, chunked_jsd, generalized_jsd_per_token, top_k_support

V, H = 37, 8


def _gkd_jsd(student_logits, teacher_logits, mask, beta):
    """TRL's own GKDTrainer.generalized_jsd_loss, summed over the masked positions."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl.experimental.gkd import GKDTrainer
    labels = torch.where(mask.bool(), 0, -100)
    return GKDTrainer.generalized_jsd_loss(
        student_logits, teacher_logits, labels=labels, beta=beta, num_items_in_batch=torch.tensor(1.0)
    )


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(2, 9, H, generator=g, dtype=torch.float64)
    teacher_states = torch.randn(2, 9, H, generator=g, dtype=torch.float64)
    head = torch.nn.Linear(H, V + 3, bias=False).double()  # a padded embedding table: 3 rows past the vocabulary
    teacher_head = torch.nn.Linear(H, V + 3, bias=False).double()
    mask = torch.ones(2, 9)
    mask[0, 6:] = 0
    return states.requires_grad_(True), teacher_states, head, teacher_head, mask


@pytest.mark.parametrize("beta", [0.5, 0.2, 0.0, 1.0])
@pytest.mark.parametrize("chunk", [1, 4, 100])
def test_chunked_full_jsd_is_gkds_loss_with_its_gradient(beta, chunk):
    states, teacher_states, head, teacher_head, mask = _setup()
    inputs = DistillInputs(states, head, V, teacher_states=teacher_states, teacher_head=teacher_head)
    total = chunked_jsd(inputs, mask, beta, chunk)
    total.backward()
    grads = states.grad.clone(), head.weight.grad.clone()

    states.grad, head.weight.grad = None, None
    expected = _gkd_jsd(head(states)[..., :V], teacher_head(teacher_states)[..., :V], mask, beta)
    expected.backward()
    assert total.item() == pytest.approx(expected.item(), rel=1e-9, abs=1e-12) and total.item() > 0
    torch.testing.assert_close(grads[0], states.grad, rtol=1e-7, atol=1e-12)
    torch.testing.assert_close(grads[1], head.weight.grad, rtol=1e-7, atol=1e-12)
    assert torch.all(grads[0][0, 6:] == 0)  # masked positions get no gradient


def test_top_k_jsd_with_the_whole_vocabulary_is_the_full_jsd_and_a_lower_bound_below_it():
    states, teacher_states, head, teacher_head, mask = _setup(1)
    teacher_logps = torch.log_softmax(teacher_head(teacher_states)[..., :V], -1).detach()
    full = chunked_jsd(
        DistillInputs(states, head, V, teacher_states=teacher_states, teacher_head=teacher_head), mask, 0.5, 4
    )
    values = []
    for k in (V, 10, 3, 1):
        logps, ids = teacher_logps.topk(k, dim=-1)
        values.append(float(chunked_jsd(DistillInputs(states, head, V, topk=TeacherTopK(ids, logps)), mask, 0.5, 4)))
    # all V tokens: the tail bucket is empty and the divergence is the full one (the tail's 1e-7 floor aside)
    assert values[0] == pytest.approx(float(full), rel=1e-5)
    # merging tokens into one bucket can only lower a divergence, and fewer tokens merge more
    assert float(full) >= values[1] >= values[2] >= values[3] >= 0.0 and values[1] > 0


def test_top_k_support_puts_the_rest_of_the_mass_in_one_bucket():
    student = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0, -1.0]]), -1)
    ids = torch.tensor([[2, 0]])
    teacher = torch.log(torch.tensor([[0.5, 0.3]]))
    s, t = top_k_support(student, ids, teacher)
    torch.testing.assert_close(t.exp(), torch.tensor([[0.5, 0.3, 0.2]]))
    p = student.exp()[0]
    torch.testing.assert_close(s.exp(), torch.tensor([[p[2], p[0], p[1] + p[3]]]))
    assert float(generalized_jsd_per_token(s, s, 0.5)) == pytest.approx(0.0, abs=1e-7)


def test_a_zero_probability_teacher_token_gives_no_nan():
    student = torch.log_softmax(torch.randn(3, 5, dtype=torch.float64), -1).requires_grad_(True)
    teacher = torch.log(torch.tensor([[1.0, 0, 0, 0, 0]] * 3, dtype=torch.float64))  # -inf entries
    loss = generalized_jsd_per_token(student, teacher, 0.5).sum()
    loss.backward()
    assert torch.isfinite(loss) and torch.all(torch.isfinite(student.grad))


def test_a_micro_batch_without_loss_positions_still_backpropagates_zero_through_the_head():
    """A rank's micro-batch of padding rows (no loss position) must still run backward through every parameter, as
    data-parallel training needs of each rank (a loss without a graph fails there)."""
    states, teacher_states, head, teacher_head, mask = _setup()
    inputs = DistillInputs(states, head, V, teacher_states=teacher_states, teacher_head=teacher_head)
    total = chunked_jsd(inputs, torch.zeros_like(mask), 0.5, 4)
    total.backward()
    assert total.item() == 0.0 and torch.all(head.weight.grad == 0) and torch.all(states.grad == 0)


@pytest.mark.parametrize("chunk_size", [1, 3, 100])
def test_chosen_token_logps_are_the_full_log_softmax_at_each_token_whatever_the_chunk(chunk_size):
    from zppo_trl.distill import chosen_token_logps

    torch.manual_seed(0)
    states = torch.randn(2, 5, 4)
    head = torch.nn.Linear(4, 7, bias=False)  # 7 outputs, the first 6 the vocabulary (a padded head)
    ids = torch.randint(0, 6, (2, 5))
    got = chosen_token_logps(states, head, 6, ids, chunk_size)
    full = torch.log_softmax(head(states)[..., :6].float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert got.shape == (2, 5) and got.dtype == torch.float32 and not got.requires_grad
    torch.testing.assert_close(got, full.detach(), rtol=0, atol=1e-6)
