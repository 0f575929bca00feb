"""The student's rollouts through vLLM's server (TRL's server mode) with weights synced through shared memory.

The unit tests cover the safetensors stream and the config; the integration tests (one class, on one server) run
ZPPO with the boxed student on vLLM's CPU server (``zppo_trl.vllm_worker`` reloading each update) and a real
teacher, on one process and on two, then a prompt beyond the server's context, then the server lost mid-run.
"""

from __future__ import annotations

import json
import math
import os
import re
import urllib.request

import peft
import pytest
import torch
from datasets import Dataset
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.checkpoint_state import ZPPO_STATE_NAME
from zppo_trl.rewards import boxed_accuracy_reward
from zppo_trl.student_server import SharedMemoryVLLMClient, stand_in_for_overlong, write_safetensors

try:
    from boxed_models import toy_rows
    from servers import kill_after_first_rollout_step
    from two_ranks import STEPS_PER_ROLLOUT, check_zppo_run, launch
except ImportError:  # tests/ imported as a package
    from tests.boxed_models import toy_rows
    from tests.servers import kill_after_first_rollout_step
    from tests.two_ranks import STEPS_PER_ROLLOUT, check_zppo_run, launch

# ---------------------------------------------------------------- the weights file


def _metadata(named):
    return [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in named]


def test_weights_stream_into_a_safetensors_file_the_server_can_read(tmp_path):
    named = [
        ("model.embed.weight", torch.randn(7, 3)),
        ("model.norm.weight", torch.randn(3, dtype=torch.bfloat16)),
        ("model.scale", torch.tensor(2.5)),  # a 0-d tensor
        ("model.steps", torch.arange(5, dtype=torch.int64)),
    ]
    path = tmp_path / "w.safetensors"
    size = write_safetensors(str(path), _metadata(named), iter(named), dtype=torch.bfloat16)
    assert size == path.stat().st_size
    with safe_open(str(path), framework="pt") as checkpoint:
        assert list(checkpoint.keys()) == sorted(name for name, _ in named)
        for name, tensor in named:
            loaded = checkpoint.get_tensor(name)
            # floating point in the server's dtype, integers as they are
            assert loaded.dtype == (torch.bfloat16 if tensor.is_floating_point() else tensor.dtype)
            assert loaded.shape == tensor.shape
            torch.testing.assert_close(loaded, tensor.to(loaded.dtype))
    write_safetensors(str(path), _metadata(named), iter(named))  # no dtype: as announced
    with safe_open(str(path), framework="pt") as checkpoint:
        assert checkpoint.get_tensor("model.embed.weight").dtype == torch.float32
        torch.testing.assert_close(checkpoint.get_tensor("model.embed.weight"), named[0][1])


def test_a_weight_stream_that_breaks_its_announcement_is_refused(tmp_path):
    named = [("a", torch.zeros(2)), ("b", torch.zeros(3))]
    with pytest.raises(ValueError, match="announced a \\[2\\], got b \\[3\\]"):
        write_safetensors(str(tmp_path / "w"), _metadata(named), iter(named[::-1]))
    with pytest.raises(ValueError, match="announced a \\[2\\], got a \\[4\\]"):
        write_safetensors(str(tmp_path / "w"), _metadata(named), iter([("a", torch.zeros(4)), named[1]]))
    with pytest.raises(ValueError):  # a tensor short
        write_safetensors(str(tmp_path / "w"), _metadata(named), iter(named[:1]))


def test_a_prompt_that_fills_the_servers_context_is_sent_as_a_stand_in():
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [4, 5, 6, 7, 8], [9]]  # the long one twice: a group of G=2
    sent, overlong = stand_in_for_overlong(prompts, context=5)
    assert overlong == [False, True, True, False]
    assert sent == [[1, 2, 3], [8], [8], [9]]  # one request of the same shape, every copy alike
    assert stand_in_for_overlong(prompts, context=6) == (prompts, [False] * 4)
    with pytest.raises(ValueError, match="a prompt with images is 5 tokens, at or over the student server's context"):
        stand_in_for_overlong(prompts, context=5, images=[None, ["image"], ["image"], None])
    # a long prompt without images next to image prompts is still replaced
    assert stand_in_for_overlong(prompts, context=5, images=[["image"], None, None, None])[1][1]


# ---------------------------------------------------------------- the config


def test_weight_transfer_defaults_to_shared_memory_without_cuda(tmp_path):
    def config(**overrides):
        return ZPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], augmentations=[], **overrides)

    assert config(use_vllm=True, vllm_mode="server").vllm_weight_transfer == (
        "nccl" if torch.cuda.is_available() else "shm"
    )
    assert config(use_vllm=True, vllm_mode="server", vllm_weight_transfer="nccl").vllm_weight_transfer == "nccl"
    assert config().vllm_weight_transfer is None  # transformers generation: nothing to sync
    with pytest.raises(ValueError, match="vllm_weight_transfer must be 'nccl' or 'shm', got 'tcp'"):
        config(use_vllm=True, vllm_mode="server", vllm_weight_transfer="tcp")
    with pytest.raises(ValueError, match="needs use_vllm: true and vllm_mode: server"):
        config(use_vllm=True, vllm_mode="colocate", vllm_weight_transfer="shm")


@pytest.mark.integration
def test_a_server_without_the_reload_extension_is_refused_by_name(vllm_boxed_teacher_server):
    """The teacher's server is a plain vLLM server: no dev mode, so no weight sync of any kind."""
    with pytest.raises(RuntimeError, match="VLLM_SERVER_DEV_MODE=1"):
        SharedMemoryVLLMClient(base_url=vllm_boxed_teacher_server.base_url.removesuffix("/v1")).init_communicator()


# ---------------------------------------------------------------- ZPPO on the student's server

TOLERANCE = 2e-3  # float32 on both sides; CPU kernels differ in summation order only


class ServerInSync(TrainerCallback):
    """After every optimizer update (skipped partitions included): TRL's own weight sync, then the
    server's per-token log-probs of a fixed completion against the trainer's (its training path)."""

    def __init__(self, sequence: list[int], prompt_length: int):
        self.trainer = None
        self.sequence, self.prompt_length = sequence, prompt_length
        self.differences: list[float] = []
        self.skipped: list[bool] = []
        self.server_logps: list[torch.Tensor] = []
        self.syncs: list[dict] = []  # this callback's own (timed by the client), apart from TRL's

    def compare(self) -> None:
        t = self.trainer
        t.vllm_generation.sync_weights()  # what the next generation does first; TRL's own cadence is left alone
        self.syncs.append(t.vllm_generation.vllm_client.sync_seconds[-1])
        server = t.vllm_generation.vllm_client.get_sequence_logprobs([self.sequence], [self.prompt_length], 1)
        server = torch.tensor([lp[0] for lp in server["actual_logprobs"][0]], dtype=torch.float64)
        ids = torch.tensor([self.sequence])
        with torch.no_grad():
            trainer = t._get_per_token_logps_and_entropies(
                t.model, ids, torch.ones_like(ids), len(self.sequence) - self.prompt_length
            )[0][0].double()
        self.differences.append(float((server - trainer).abs().max()))
        self.server_logps.append(server)

    def on_train_begin(self, args, state, control, **kwargs):
        self.compare()

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        self.skipped.append(bool(t._buffered_inputs[(t._step - 1) % args.steps_per_generation].get("zppo_skip")))
        self.compare()


class LastStepAllRight:
    """The boxed reward, except that every rollout from update ``from_update`` on is right: those
    groups have no signal, so their partitions are skipped (no gradient, parameters untouched)."""

    __name__ = "boxed"

    def __init__(self, from_update: int):
        self.trainer, self.from_update = None, from_update
        self.reformulated_prompts = self.groups = 0

    def __call__(self, prompts, completions, answer, completion_ids=None, **kwargs):
        if completion_ids is not None:  # the student's rounds (the teacher's answers come without ids)
            self.reformulated_prompts += sum("<candidate>" in str(p) for p in prompts)
            self.groups += len(prompts) // self.trainer.num_generations
            if self.trainer.state.global_step >= self.from_update:
                return [1.0] * len(completions)
        return boxed_accuracy_reward(completions, answer)


class StudentRounds:
    """The boxed reward, recording each student round's prompts and completions (the teacher's answers, which the
    same functions grade, come without ids)."""

    __name__ = "boxed"

    def __init__(self):
        self.prompts, self.completions = [], []

    def __call__(self, prompts, completions, answer, completion_ids=None, **kwargs):
        if completion_ids is not None:
            self.prompts.append(prompts)
            self.completions.append(completions)
        return boxed_accuracy_reward(completions, answer)


class FirstOfEachGroupRight:
    """The first rollout of each group right, the others wrong: every group whose rollouts differ has a signal,
    whatever they say (plain accuracy 1/G, so every question is hard)."""

    __name__ = "first_of_each_group"

    def __init__(self, num_generations: int):
        self.num_generations = num_generations

    def __call__(self, prompts, completions, **kwargs):
        return [float(i % self.num_generations == 0) for i in range(len(completions))]


def _fixed_sequence(tokenizer) -> tuple[list[int], int]:
    """A fixed scored sequence: the first toy question's prompt as the trainer renders it, and a boxed answer."""
    question = tokenizer.apply_chat_template(
        [{"role": "user", "content": toy_rows("text")[0]["question"]}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(question)["input_ids"]
    answer = tokenizer("<think> Let me compute. </think> \\boxed{7}<|im_end|>")["input_ids"]
    return prompt_ids + answer, len(prompt_ids)


def _server_requests(server) -> float:
    """The student server's finished requests, from its Prometheus metrics."""
    with urllib.request.urlopen(f"{server.root_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


def _grpo_dagger(tmp_path, server, **overrides) -> ZPPOConfig:
    settings = dict(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[], save_strategy="no", seed=0,
        disable_tqdm=True, logging_steps=1, learning_rate=1e-4, augmentations=[],
        per_device_train_batch_size=16, num_generations=4, max_completion_length=16, max_prompt_length=1024,
        num_partitions=2, gradient_accumulation_steps=1, max_steps=2, replay_fraction=0.0,
        use_vllm=True, vllm_mode="server", vllm_server_base_url=server.root_url, vllm_server_timeout=60,
        vllm_max_model_length=server.max_model_len,
    )  # fmt: skip
    settings.update(overrides)
    return ZPPOConfig(**settings)


@pytest.fixture(scope="class")
def student_server(boxed_text_student_dir, tmp_path_factory):
    """The boxed student on the student vLLM server ``serve_student.sh --cpu`` starts (servers.
    LaunchedVLLMStudentServer), its engine bound to the last core as the demo binds it, for the tests of one class,
    in order (the last kills it): a server start is most of a minute of a core. Every trainer pushes its weights
    before its first generation, so each test's run starts from its own. Its context, 2,048 tokens, is what the
    script is given for ZPPOConfig.context_lengths().student at max_prompt_length 1,024 and max_completion_length
    32 (1,769)."""
    from conftest import require_vllm
    from servers import LaunchedVLLMStudentServer

    require_vllm()
    log_dir = tmp_path_factory.mktemp("student-server")
    core = str(max(os.sched_getaffinity(0)))
    server = LaunchedVLLMStudentServer(boxed_text_student_dir, log_dir=log_dir, max_model_len=2048, cpu_cores=core)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.mark.integration
class TestOneStudentServer:
    """The script's student server, then four runs on it (a class: one pytest-xdist worker runs them, in this
    order; the last kills it)."""

    def test_serve_student_sh_started_it_for_the_trainers_client(self, student_server, boxed_text_student_dir,
                                                                  tmp_path):  # fmt: skip
        """The script's server is the one the trainer's shared-memory client needs: dev mode, the reload
        extension, the engine bound where it was told; after a sync it scores with the trainer's weights (a changed
        model, tied head included)."""
        server = student_server
        assert f"core ids=[{server.cpu_cores}]" in server.server_log_path.read_text()  # the worker's own binding
        client = SharedMemoryVLLMClient(base_url=server.root_url, weight_dir=str(tmp_path))
        client.init_communicator("cpu")
        assert client.weight_dtype == torch.float32
        model = AutoModelForCausalLM.from_pretrained(boxed_text_student_dir)
        with torch.no_grad():  # a different policy, its tied embedding / LM head most of all
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.1)
        client.update_model_params(model)
        client.reset_prefix_cache()
        assert not list(tmp_path.glob("*.safetensors"))  # the weights file is gone once reloaded
        sequence = list(range(5, 25))
        served = client.get_sequence_logprobs([sequence], [4], top_logprobs=1)["actual_logprobs"][0]
        with torch.no_grad():
            logps = model(torch.tensor([sequence])).logits[0, 3:-1].log_softmax(-1)
        trainer = logps.gather(1, torch.tensor(sequence[4:])[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor([lp[0] for lp in served]), trainer, atol=TOLERANCE, rtol=0)
        generated = client.generate([sequence[:4]], n=2, max_tokens=3, temperature=1.0)
        assert len(generated["completion_ids"]) == 2 and all(1 <= len(ids) <= 3 for ids in generated["completion_ids"])

    def test_zppo_rollouts_come_from_the_student_server_and_it_follows_every_update(
        self, student_server, boxed_text_student_dir, vllm_boxed_teacher_server, tmp_path
    ):
        server, teacher = student_server, vllm_boxed_teacher_server
        tokenizer = AutoTokenizer.from_pretrained(boxed_text_student_dir)
        in_sync = ServerInSync(*_fixed_sequence(tokenizer))
        reward = LastStepAllRight(from_update=4)  # the third rollout step
        args = ZPPOConfig(
            output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[], save_strategy="no", seed=0,
            disable_tqdm=True, logging_steps=1, learning_rate=1e-4,
            per_device_train_batch_size=16, num_generations=4, max_completion_length=32,
            num_partitions=2, gradient_accumulation_steps=1, max_steps=6,  # three rollout steps
            replay_fraction=0.5, augment_fraction=0.5,
            teacher_base_url=teacher.base_url, teacher_model=teacher.model, teacher_max_tokens=32,
            compression_max_tokens=48, max_prompt_length=1024,
            use_vllm=True, vllm_mode="server", vllm_server_base_url=server.root_url, vllm_server_timeout=60,
            vllm_max_model_length=server.max_model_len,
        )  # fmt: skip
        assert args.vllm_weight_transfer == "shm"
        requests_before = _server_requests(server)
        trainer = ZPPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
            reward_funcs=reward,
            args=args,
            train_dataset=Dataset.from_list(toy_rows("text")),
            processing_class=tokenizer,
            callbacks=[in_sync],
        )
        in_sync.trainer = reward.trainer = trainer
        trainer.train()

        # Every round's rollouts came from the server: BCQ/NCQ ones included.
        client = trainer.vllm_generation.vllm_client
        assert isinstance(client, SharedMemoryVLLMClient)
        assert trainer.counters["bcq_total"] + trainer.counters["ncq_total"] > 0
        assert reward.reformulated_prompts > 0
        assert _server_requests(server) - requests_before >= reward.groups > 0  # every scored group was requested

        # The server followed the trainer after every update, the skipped ones too, and the policy moved.
        assert len(in_sync.differences) == 1 + 6
        assert max(in_sync.differences) < TOLERANCE, in_sync.differences
        assert in_sync.skipped[-2:] == [True, True] and not all(in_sync.skipped[:4]), in_sync.skipped
        moved = float((in_sync.server_logps[4] - in_sync.server_logps[0]).abs().max())
        # well past the sync tolerance (how far depends on how many of the first four updates had a signal: 0.09 to
        # over 0.1 seen on the same code)
        assert moved > 20 * TOLERANCE, moved
        torch.testing.assert_close(in_sync.server_logps[-1], in_sync.server_logps[4], atol=TOLERANCE, rtol=0)

        # Each sync is timed: one per check here (before training, after each update) and TRL's own, once
        # before each rollout step's first generation (its second round, BCQ/NCQ, needs none).
        assert len(client.sync_seconds) == 1 + 6 + 3
        assert all(s["bytes"] > 0 and s["reload"] > 0 and not math.isnan(s["write"]) for s in client.sync_seconds)
        json.dumps(client.sync_seconds)  # plain numbers, ready for a log
        # TRL's syncs (the first of each rollout step's, in its plain round) are the trainer's zppo/time/weight_sync_s
        logged = [h["zppo/time/weight_sync_s"] for h in trainer.state.log_history if "zppo/time/rollout_step_s" in h]
        trl_syncs = [s["write"] + s["reload"] for s in client.sync_seconds if not any(s is c for c in in_sync.syncs)]
        assert len(logged) == len(trl_syncs) == 3
        assert logged == pytest.approx(trl_syncs)
        # The production topology hides the plain rollouts' old log-probs behind the BCQ/NCQ round (overlap_old_logps;
        # the exactness of it: tests/test_trainer_zppo.py): done on the second thread every rollout step.
        steps = [h for h in trainer.state.log_history if "zppo/time/rollout_step_s" in h]
        assert all(h["zppo/time/old_logps_hidden_s"] > 0 for h in steps)

    def test_the_pipelined_second_round_sends_what_the_serial_one_sends(
        self, student_server, boxed_text_student_dir, vllm_boxed_teacher_server, tmp_path
    ):
        """``pipeline_second_round`` off, then on: one rollout step each from the same seed, student and teacher
        greedy. The same prompts in the same order in both rounds, the same groups, plan and
        buffer; only when the BCQ/NCQ prompts reached the server differs (each as its compressions returned)."""
        runs = {}
        for pipelined in (False, True):
            rounds = StudentRounds()
            args = ZPPOConfig(
                output_dir=str(tmp_path / f"out-{pipelined}"), use_cpu=True, bf16=False, report_to=[],
                save_strategy="no", seed=0, disable_tqdm=True, logging_steps=1, learning_rate=1e-4,
                per_device_train_batch_size=16, num_generations=4, max_completion_length=32, num_partitions=2,
                gradient_accumulation_steps=1, max_steps=2, replay_fraction=0.0, augment_fraction=1.0,
                teacher_base_url=vllm_boxed_teacher_server.base_url, teacher_model=vllm_boxed_teacher_server.model,
                teacher_max_tokens=32, teacher_temperature=0.0, teacher_num_generations=1, compression_max_tokens=48,
                max_prompt_length=1024,
                use_vllm=True, vllm_mode="server", vllm_server_base_url=student_server.root_url,
                vllm_server_timeout=60, vllm_max_model_length=student_server.max_model_len,
                top_k=1, pipeline_second_round=pipelined,  # argmax (a per-request seed crashes vLLM's CPU engine)
            )  # fmt: skip
            trainer = ZPPOTrainer(
                model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
                reward_funcs=rounds,
                args=args,
                train_dataset=Dataset.from_list(toy_rows("text")),
                processing_class=AutoTokenizer.from_pretrained(boxed_text_student_dir),
            )
            trainer.train()
            [step] = [h for h in trainer.state.log_history if "zppo/time/rollout_step_s" in h]
            runs[pipelined] = rounds, trainer, step
        (serial, serial_trainer, serial_step), (piped, piped_trainer, piped_step) = runs[False], runs[True]
        assert len(serial.prompts) == len(piped.prompts) == 2  # the plain round, then the BCQ/NCQ one
        assert piped.prompts == serial.prompts and any("<candidate>" in str(p) for p in piped.prompts[1])
        assert piped.completions[0] == serial.completions[0]  # the same plain round, so the same plan
        assert piped_trainer.replay_buffer.residents() == serial_trainer.replay_buffer.residents()
        for name in ("bcq", "ncq", "bcq_trained", "ncq_trained", "dropped", "compression_failures", "plain_accuracy"):
            assert piped_step[f"zppo/{name}"] == serial_step[f"zppo/{name}"], name
        built = piped_step["zppo/bcq"] + piped_step["zppo/ncq"] - piped_step["zppo/dropped"]
        assert piped_step["zppo/second_round_sent_early"] == built > 0  # every built group went out early
        assert "zppo/second_round_sent_early" not in serial_step and serial_trainer.early_rollouts is None

    def test_two_ranks_share_it_and_decide_alike(self, student_server, boxed_text_student_dir, boxed_teacher_server,
                                                 tmp_path):  # fmt: skip
        """ZPPO on 2 ranks with its rollouts on the server: only the main process connects, and every decision is
        replicated as when the trainer generates them (test_distributed.py)."""
        run = launch(tmp_path, [dict(
            name="zppo", mode="zppo", model_dir=str(boxed_text_student_dir), max_steps=3 * STEPS_PER_ROLLOUT,
            teacher_url=boxed_teacher_server.base_url, teacher_model=boxed_teacher_server.model,
            student_url=student_server.root_url, student_context=student_server.max_model_len,
        )])["zppo"]  # fmt: skip
        assert [r["student_client"] for r in run] == ["SharedMemoryVLLMClient", "NoneType"]
        check_zppo_run(run)
        # the BCQ/NCQ prompts went out as their compressions returned, each rank's through its own client (TRL's
        # server mode sends every rank's prompts through the main process)
        assert [r["early_client"] for r in run] == ["SharedMemoryVLLMClient", "VLLMClient"]
        assert all(r["sent_early"] > 0 for r in run), [r["sent_early"] for r in run]

    def test_a_prompt_beyond_the_servers_context_costs_its_group_not_the_step(
        self, student_server, boxed_text_student_dir, tmp_path, caplog
    ):
        server = student_server
        tokenizer = AutoTokenizer.from_pretrained(boxed_text_student_dir)
        rows = toy_rows("text")[:7]
        long_row = {**rows[0], "id": "long", "question": "Think it over. " * 210 + rows[0]["question"]}
        dataset = Dataset.from_list([*rows, long_row])  # 8 questions: one rollout step draws them all

        # a server smaller than the config says is refused before any training
        with pytest.raises(ValueError, match="--max-model-len 2048, below vllm_max_model_length \\(4096\\)"):
            ZPPOTrainer(model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
                        args=_grpo_dagger(tmp_path, server, vllm_max_model_length=4096), train_dataset=dataset,
                        processing_class=tokenizer)  # fmt: skip

        trainer = ZPPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
            args=_grpo_dagger(tmp_path, server),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        with caplog.at_level("WARNING", logger="zppo_trl.trainer"):
            trainer.train()
        logs = [h for h in trainer.state.log_history if "zppo/prompts_beyond_context" in h]
        assert [h["zppo/prompts_beyond_context"] for h in logs] == [1]
        assert "fill the student server's whole context (vllm_max_model_length=2048)" in caplog.text
        assert "question ids ['long']" in caplog.text
        assert trainer.state.global_step == 2  # the step trained on the other seven questions

    def test_a_lora_student_syncs_its_merged_weights_and_checkpoints_its_adapter(
        self, student_server, tiny_text_model_dir, tmp_path
    ):
        """A GRPO user's LoRA run in server mode (the GRPO row, no teacher): TRL's sync merges the adapter, streams the
        base model's tensors under their own names and unmerges; the server scores as the adapted model after every
        update, and the checkpoint holds the adapter and the ZPPO state.

        The base is the tiny random model the boxed student was fitted from (its architecture and tokenizer: the
        server takes its weights before the first generation), so that every group's rollouts differ and every
        update trains, on any CPU: the boxed student's groups can come out all right or all wrong on a whole step,
        as one fit did on an AVX2-only EPYC."""
        server = student_server
        tokenizer = AutoTokenizer.from_pretrained(tiny_text_model_dir)
        base = AutoModelForCausalLM.from_pretrained(tiny_text_model_dir)
        base_params = {name: param.detach().clone() for name, param in base.named_parameters()}
        sequence, prompt_length = _fixed_sequence(tokenizer)
        in_sync = ServerInSync(sequence, prompt_length)
        lora = peft.LoraConfig(
            r=8, lora_alpha=16, task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )  # fmt: skip
        # one rollout step (two updates) saved at its end, and a LoRA learning rate that moves the adapted policy well
        # past the sync tolerance in two updates
        args = _grpo_dagger(tmp_path, server, learning_rate=1e-2, save_strategy="steps", save_steps=2)
        assert args.vllm_weight_transfer == "shm" and not args.augmentations and args.teacher_base_url is None
        trainer = ZPPOTrainer(
            model=base,
            reward_funcs=FirstOfEachGroupRight(args.num_generations),
            args=args,
            train_dataset=Dataset.from_list(toy_rows("text")),
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=[in_sync],
        )
        assert isinstance(trainer.model, peft.PeftModel)
        in_sync.trainer = trainer
        trainer.train()
        assert trainer.state.global_step == 2

        # What reached the server: the base model's tensors, under its names and shapes (the adapter merged into
        # them, no lora_A/lora_B/base_layer names); the client checks that the server reloaded every one of them.
        client = trainer.vllm_generation.vllm_client
        assert isinstance(client, SharedMemoryVLLMClient)
        sent = trainer.vllm_generation._weight_metadata  # TRL's announcement, which the written stream must match
        assert [(name, shape) for name, _, shape in sent] == [(n, list(p.shape)) for n, p in base_params.items()]
        assert len(client.sync_seconds) == 1 + 2 + 1  # the callback's (before training, after each update) and TRL's
        assert all(s["bytes"] > 4 * sum(p.numel() for p in base_params.values()) for s in client.sync_seconds)

        # The server followed the adapted (merged) policy after every update, and that policy moved: the adapter's
        # B starts at zero, so the first comparison is the base model's and only training can move it.
        assert len(in_sync.differences) == 1 + 2
        assert in_sync.skipped == [False, False], in_sync.skipped  # both updates trained
        assert max(in_sync.differences) < TOLERANCE, in_sync.differences
        moved = float((in_sync.server_logps[-1] - in_sync.server_logps[0]).abs().max())
        assert moved > 20 * TOLERANCE, moved
        # Every sync merged and unmerged: the frozen base weights are what they were.
        for name, param in trainer.model.get_base_model().named_parameters():
            if "lora_" not in name:
                original = base_params[name.replace(".base_layer", "")]
                torch.testing.assert_close(param.detach(), original, atol=1e-6, rtol=0)

        # The checkpoint at the end of the rollout step: the adapter (not a full model) and ZPPO's state.
        checkpoint = tmp_path / "out" / "checkpoint-2"
        assert (checkpoint / "adapter_model.safetensors").is_file() and (checkpoint / "adapter_config.json").is_file()
        assert not (checkpoint / "model.safetensors").exists()
        state = json.loads((checkpoint / ZPPO_STATE_NAME).read_text())
        assert state["buffer"] == trainer.replay_buffer.state_dict()
        assert state["buffer"]["residents"], "no hard question reached the buffer"  # every question is at 1/G
        # The saved adapter, merged into the base model, is the policy the server ended on.
        merged = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_text_model_dir),
                                                str(checkpoint)).merge_and_unload()  # fmt: skip
        with torch.no_grad():
            logps = merged(torch.tensor([sequence])).logits[0, prompt_length - 1 : -1].double().log_softmax(-1)
        merged_logps = logps.gather(1, torch.tensor(sequence[prompt_length:])[:, None])[:, 0]
        torch.testing.assert_close(in_sync.server_logps[-1], merged_logps, atol=TOLERANCE, rtol=0)

    def test_a_student_server_lost_mid_run_stops_training_naming_it(
        self, student_server, boxed_text_student_dir, tmp_path
    ):
        server = student_server
        trainer = ZPPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
            args=_grpo_dagger(tmp_path, server, max_steps=4),
            train_dataset=Dataset.from_list(toy_rows("text")),
            processing_class=AutoTokenizer.from_pretrained(boxed_text_student_dir),
            callbacks=[kill_after_first_rollout_step(server)],
        )
        # TRL's client retries a refused connection five times, backing off 2, 4, 8, 16 and 32 s: the same
        # five retries without the minute of waiting between them
        for adapter in trainer.vllm_generation.vllm_client.session.adapters.values():
            adapter.max_retries = adapter.max_retries.new(backoff_factor=0)
        with pytest.raises(RuntimeError, match=f"student vLLM server at {server.root_url} stopped answering "
                                               "\\(at rollout step 2\\)"):  # fmt: skip
            trainer.train()
        assert trainer.state.global_step == 2  # nothing trained after the loss, with or without rollouts
