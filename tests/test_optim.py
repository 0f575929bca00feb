"""`AnyPrecisionAdamW`: the paper's AdamW with bf16 optimizer state, against torch's AdamW.

The trajectories are compared on a small regression (``optim_problem.py``: a 2-layer tanh MLP
fitting ``sin(sum x)``, fixed seed, full batch) by the distance between the final parameters
divided by how far the reference moved from the initialisation, so a tolerance reads as a
fraction of the training. Two integration tests go further: FSDP2 (two spawned gloo ranks, about
15 s) runs the optimizer on DTensor shards and through accelerate's checkpoint path, and a trainer
run stopped and resumed from its checkpoint ends where the straight run ends.
The tolerances were set against broken optimizers: over initialisation seeds 0-4, bf16 moments end
0.022-0.045 of the displacement from torch's AdamW with the loss within 0.3%, while a missing first
(second) bias correction ends 0.14-0.19 (1.4-2.1) away and coupled L2 weight decay 1.4-1.5, with
the loss off by 6% or more.
"""

from __future__ import annotations

import copy
import io
import socket

import pytest
import torch
import torch.multiprocessing as mp
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.optim import AnyPrecisionAdamW, anyprecision_kwargs, state_bytes_per_parameter

try:  # tests/ is on sys.path under pytest's default (rootdir-less, prepend) import mode
    from optim_problem import FP32_MOMENTS, FSDP2_STEPS, HYPER, flat, fsdp2_rank, make_net, train
except ImportError:  # tests/ imported as a package
    from tests.optim_problem import FP32_MOMENTS, FSDP2_STEPS, HYPER, flat, fsdp2_rank, make_net, train


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: a second intra-op thread only adds contention (10x slower on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(make, steps: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(initial parameters, final parameters, last loss) of ``steps`` full-batch steps."""
    net = make_net(dtype=dtype)
    start = flat(net)
    loss = train(net, make(net.parameters()), steps)
    return start, flat(net), loss


def _off_course(run: torch.Tensor, reference: torch.Tensor, start: torch.Tensor) -> float:
    """How far ``run`` ended from ``reference``, as a fraction of the reference's own displacement."""
    return ((run - reference).norm() / (reference - start).norm()).item()


def test_bf16_moments_track_torch_adamw_over_300_steps():
    start, reference, reference_loss = _run(lambda p: torch.optim.AdamW(p, **HYPER), 300)
    _, ours, loss = _run(lambda p: AnyPrecisionAdamW(p, **HYPER), 300)
    # Measured (seed 0): 0.027 of the displacement, loss within 0.3%; a wrong formula is >= 0.14 away.
    assert _off_course(ours, reference, start) < 0.07
    assert abs(loss / reference_loss - 1) < 0.02


def test_fp32_moments_are_torch_adamw_to_float_rounding():
    net, twin = make_net(), make_net()
    torch_adamw = torch.optim.AdamW(twin.parameters(), **{**HYPER, "lr": 1e-2})
    ours = AnyPrecisionAdamW(net.parameters(), **{**HYPER, "lr": 1e-2}, **FP32_MOMENTS)
    train(twin, torch_adamw, 100)
    train(net, ours, 100)
    torch.testing.assert_close(flat(net), flat(twin), rtol=1e-6, atol=1e-7)
    for p, q in zip(net.parameters(), twin.parameters()):
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours.state[p][name], torch_adamw.state[q][name], rtol=1e-6, atol=1e-9)


def _state_bytes(optimizer: torch.optim.Optimizer, names=("exp_avg", "exp_avg_sq")) -> int:
    return sum(s[n].numel() * s[n].element_size() for s in optimizer.state.values() for n in names if n in s)


@pytest.mark.parametrize("kahan", [False, True])
def test_the_state_is_half_of_torch_adamws_for_fp32_parameters(kahan):
    net, twin = make_net(), make_net()
    ours = AnyPrecisionAdamW(net.parameters(), use_kahan_summation=kahan, **HYPER)
    torch_adamw = torch.optim.AdamW(twin.parameters(), **HYPER)
    train(net, ours, 1)
    train(twin, torch_adamw, 1)
    numel = sum(p.numel() for p in net.parameters())
    assert _state_bytes(torch_adamw) == 8 * numel
    assert _state_bytes(ours) == 4 * numel
    # fp32 weights need no compensation: Kahan adds no buffer to them.
    assert all(set(s) == {"step", "exp_avg", "exp_avg_sq"} for s in ours.state.values())
    assert {s[n].dtype for s in ours.state.values() for n in ("exp_avg", "exp_avg_sq")} == {torch.bfloat16}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_bytes_per_parameter_is_what_the_optimizer_allocates(dtype):
    kwargs = anyprecision_kwargs("use_kahan_summation=true,momentum_dtype=bfloat16,variance_dtype=bfloat16")
    net = make_net(dtype=dtype)
    optimizer = AnyPrecisionAdamW(net.parameters(), **HYPER, **kwargs)
    train(net, optimizer, 1)
    numel = sum(p.numel() for p in net.parameters())
    allocated = _state_bytes(optimizer, ("exp_avg", "exp_avg_sq", "compensation"))
    assert allocated == state_bytes_per_parameter(kwargs, dtype) * numel
    assert state_bytes_per_parameter(kwargs, dtype) == {torch.float32: 4, torch.bfloat16: 6}[dtype]
    assert state_bytes_per_parameter(anyprecision_kwargs(None)) == 8  # transformers' defaults: fp32 moments


def test_kahan_summation_keeps_bf16_weights_on_the_fp32_trajectory():
    hyper = {**HYPER, "lr": 1e-4}
    start, reference, _ = _run(lambda p: AnyPrecisionAdamW(p, **hyper, **FP32_MOMENTS), 200)
    _, plain, _ = _run(lambda p: AnyPrecisionAdamW(p, **hyper), 200, dtype=torch.bfloat16)
    kahan_net = make_net(dtype=torch.bfloat16)
    kahan_optimizer = AnyPrecisionAdamW(kahan_net.parameters(), use_kahan_summation=True, **hyper)
    train(kahan_net, kahan_optimizer, 200)
    # Measured (seeds 0-4): bf16 weights end 0.94-0.99 of the displacement off course, with Kahan 0.022-0.030.
    assert _off_course(plain, reference, start) > 0.5
    assert _off_course(flat(kahan_net), reference, start) < 0.1
    compensation = [s["compensation"] for s in kahan_optimizer.state.values()]
    assert len(compensation) == 4 and all(c.dtype == torch.bfloat16 for c in compensation)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_state_dict_round_trip_restores_the_bf16_state_exactly(dtype):
    net = make_net(dtype=dtype)
    optimizer = AnyPrecisionAdamW(net.parameters(), use_kahan_summation=True, **HYPER)
    train(net, optimizer, 5)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)  # as transformers writes optimizer.pt
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    resumed_net = copy.deepcopy(net)
    resumed = AnyPrecisionAdamW(resumed_net.parameters(), **FP32_MOMENTS)  # the saved settings win
    resumed.load_state_dict(saved)  # torch's loader casts every buffer to the parameter's dtype
    assert resumed.param_groups[0]["momentum_dtype"] == torch.bfloat16
    for p, q in zip(net.parameters(), resumed_net.parameters()):
        assert optimizer.state[p].keys() == resumed.state[q].keys()
        for name, value in optimizer.state[p].items():
            assert resumed.state[q][name].dtype == value.dtype
            assert torch.equal(resumed.state[q][name], value)
    train(net, optimizer, 5)
    train(resumed_net, resumed, 5)
    assert torch.equal(flat(net), flat(resumed_net))


def test_a_torch_adamw_state_dict_loads_into_bf16_moments():
    twin = make_net()
    torch_adamw = torch.optim.AdamW(twin.parameters(), **HYPER)
    train(twin, torch_adamw, 3)
    net = copy.deepcopy(twin)
    ours = AnyPrecisionAdamW(net.parameters(), **HYPER)
    ours.load_state_dict(torch_adamw.state_dict())
    for p, q in zip(net.parameters(), twin.parameters()):
        assert ours.state[p]["exp_avg"].dtype == torch.bfloat16
        assert torch.equal(ours.state[p]["exp_avg"], torch_adamw.state[q]["exp_avg"].bfloat16())
    train(net, ours, 1)  # the settings torch's groups lack come from the defaults
    assert int(ours.state[next(net.parameters())]["step"]) == 4


def test_optim_args_in_transformers_format():
    assert anyprecision_kwargs(None) == {
        "use_kahan_summation": False,
        "momentum_dtype": torch.float32,
        "variance_dtype": torch.float32,
        "compensation_buffer_dtype": torch.bfloat16,
    }
    assert anyprecision_kwargs("use_kahan_summation=True, momentum_dtype=bfloat16,variance_dtype=bfloat16") == {
        "use_kahan_summation": True,
        "momentum_dtype": torch.bfloat16,
        "variance_dtype": torch.bfloat16,
        "compensation_buffer_dtype": torch.bfloat16,
    }


@pytest.mark.parametrize(
    "optim_args, named",
    [
        ("momentum_dtpye=bfloat16", "momentum_dtpye"),
        ("variance_dtype=bf16", "variance_dtype"),
        ("compensation_buffer_dtype=int8", "compensation_buffer_dtype"),
        ("use_kahan_summation=maybe", "use_kahan_summation"),
        ("use_kahan_summation", "use_kahan_summation"),
        ("momentum_dtype=float32,momentum_dtype=bfloat16", "momentum_dtype"),
    ],
)
def test_bad_optim_args_are_refused_naming_the_key(optim_args, named):
    with pytest.raises(ValueError, match=rf"optim_args.*{named}"):
        anyprecision_kwargs(optim_args)
    with pytest.raises(ValueError, match=rf"optim_args.*{named}"):
        ZPPOConfig(**_CPU, optim="adamw_anyprecision", optim_args=optim_args)


def test_bad_constructor_settings_are_refused():
    params = make_net().parameters()
    with pytest.raises(ValueError, match="momentum_dtype"):
        AnyPrecisionAdamW(params, momentum_dtype=torch.int8)
    with pytest.raises(ValueError, match="betas"):
        AnyPrecisionAdamW(make_net().parameters(), betas=(0.9, 1.0))


_CPU = dict(output_dir="unused", use_cpu=True, bf16=False, augmentations=[], report_to=[])
QUESTIONS = [dict(id=f"q{i}", question=f"What is {i} + {i}?", images=[], answer=str(2 * i)) for i in range(8)]


def _trainer(model_dir, tmp_path, **overrides) -> ZPPOTrainer:
    settings = dict(
        _CPU,
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        num_partitions=1,
        learning_rate=1e-2,
        adam_beta1=0.8,
        adam_beta2=0.99,
        adam_epsilon=1e-6,
        weight_decay=0.1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    settings.update(overrides)

    def reward(completions, **kwargs):
        return [float(len(str(c)) % 2) for c in completions]

    return ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=reward,
        args=ZPPOConfig(**settings),
        train_dataset=Dataset.from_list(QUESTIONS),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )


def test_the_trainer_builds_it_from_optim_and_optim_args(tiny_text_model_dir, tmp_path):
    ours = _trainer(
        tiny_text_model_dir,
        tmp_path,
        optim="adamw_anyprecision",
        optim_args="use_kahan_summation=true,momentum_dtype=bfloat16,variance_dtype=bfloat16",
    )
    plain = _trainer(tiny_text_model_dir, tmp_path, optim="adamw_torch")
    optimizer, torch_adamw = ours.create_optimizer(), plain.create_optimizer()
    assert type(optimizer) is AnyPrecisionAdamW and type(torch_adamw) is torch.optim.AdamW
    # transformers' groups (weight decay off for norms and biases) with its lr, betas and eps.
    names = {p: n for n, p in ours.model.named_parameters()}
    plain_names = {p: n for n, p in plain.model.named_parameters()}
    assert [([names[p] for p in g["params"]], g["weight_decay"]) for g in optimizer.param_groups] == [
        ([plain_names[p] for p in g["params"]], g["weight_decay"]) for g in torch_adamw.param_groups
    ]
    assert {g["weight_decay"] for g in optimizer.param_groups} == {0.1, 0.0}
    for group in optimizer.param_groups:
        assert (group["lr"], group["betas"], group["eps"]) == (1e-2, (0.8, 0.99), 1e-6)
        assert group["use_kahan_summation"] is True
        assert (group["momentum_dtype"], group["variance_dtype"]) == (torch.bfloat16, torch.bfloat16)

    before = {n: p.detach().clone() for n, p in ours.model.named_parameters()}
    ours.args.max_steps = 1
    ours.train()  # one rollout step, one optimizer update
    assert ours.optimizer.optimizer is optimizer  # accelerate wraps it, the trainer steps ours
    changed = [n for n, p in ours.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed and all(optimizer.state[p]["exp_avg"].dtype == torch.bfloat16 for p in optimizer.state)
    assert {int(s["step"]) for s in optimizer.state.values()} == {1}


@pytest.mark.integration
def test_a_resumed_trainer_run_ends_where_the_straight_run_ends(tiny_text_model_dir, tmp_path):
    """transformers' checkpoint path (``optimizer.pt``) with bf16 moments: stopped at step 2 and resumed,
    the run ends where the straight 4-step run ends, bit for bit, its moments still bf16."""
    optim = dict(optim="adamw_anyprecision", optim_args="momentum_dtype=bfloat16,variance_dtype=bfloat16")
    straight = _trainer(tiny_text_model_dir, tmp_path, output_dir=str(tmp_path / "straight"), max_steps=4, **optim)
    straight.train()
    first = dict(output_dir=str(tmp_path / "resumed"), save_strategy="steps", save_steps=2, **optim)
    _trainer(tiny_text_model_dir, tmp_path, max_steps=2, **first).train()
    resumed = _trainer(tiny_text_model_dir, tmp_path, max_steps=4, **first)
    resumed.train(resume_from_checkpoint=True)
    optimizer, straight_optimizer = resumed.optimizer.optimizer, straight.optimizer.optimizer
    assert type(optimizer) is AnyPrecisionAdamW and optimizer.state
    assert {s[n].dtype for s in optimizer.state.values() for n in ("exp_avg", "exp_avg_sq")} == {torch.bfloat16}
    for name, p in straight.model.named_parameters():
        assert torch.equal(resumed.model.get_parameter(name), p), name
        state, straight_state = optimizer.state[resumed.model.get_parameter(name)], straight_optimizer.state[p]
        assert state.keys() == straight_state.keys() and all(torch.equal(state[k], straight_state[k]) for k in state)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.integration
def test_fsdp2_shards_train_as_one_process_and_resume_in_bf16(tmp_path):
    out = str(tmp_path / "rank0.pt")
    mp.spawn(fsdp2_rank, args=(2, _free_port(), out), nprocs=2)
    result = torch.load(out)
    assert result["exact"], "the DCP round trip must keep DTensor bf16 state, equal"
    net = make_net()
    train(net, AnyPrecisionAdamW(net.parameters(), **{**HYPER, "lr": 1e-2}), 2 * FSDP2_STEPS)
    # FSDP2 averages the two ranks' equal gradients: the sharded run is the single-process one.
    for sharded, single in zip(result["params"], net.parameters()):
        torch.testing.assert_close(sharded, single.detach(), rtol=1e-6, atol=1e-7)
