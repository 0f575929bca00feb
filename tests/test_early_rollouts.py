"""The second round pipelined behind its compressions (``zppo_trl.early_rollouts``, ``pipeline_second_round``).

Here: the early request asks the server for what TRL's server mode asks, the build hands each instance's group on
as its own candidates return (a rejected compression costs only its instance), and the matching of a round's prompts
to the requests in flight. The runs, pipelined against serial, are in tests/test_student_server.py (one student
server for its class): the same prompts, groups and decisions on a seeded run, and two ranks each sending its own.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from accelerate import PartialState
from trl.generation.vllm_generation import VLLMGeneration

from zppo_trl.augmentations import CandidateReformulation
from zppo_trl.augmentations.candidates import each_instance
from zppo_trl.early_rollouts import EarlyRollouts, round_prompt, server_sampling
from zppo_trl.reformulate import Reformulation
from zppo_trl.teacher import TeacherClient


class RecordingClient:
    """Stands in for the student server's client where only what is asked of it is under test: records each
    ``generate`` call and answers every prompt with ``n`` one-token completions naming the prompt."""

    def __init__(self):
        self.calls: list[dict] = []
        self.lock = threading.Lock()

    def generate(self, prompts, features=None, **params):
        with self.lock:
            self.calls.append({"prompts": [list(p) for p in prompts], "features": features, **params})
        n = params["n"]
        return {
            "prompt_ids": prompts,
            "completion_ids": [[p[0], i] for p in prompts for i in range(n)],
            "logprobs": [[[-0.5], [-float(i)]] for _ in prompts for i in range(n)],
            "logprob_token_ids": None,
        }


def _trl_generation(client: RecordingClient) -> VLLMGeneration:
    """TRL's VLLMGeneration in server mode on one process, its client ``client`` (not connected: no server)."""
    PartialState()
    generation = object.__new__(VLLMGeneration)
    generation.accelerator = SimpleNamespace(is_main_process=True, process_index=0)
    generation.mode, generation.enable_sleep_mode = "server", False
    generation.temperature, generation.top_p, generation.top_k, generation.min_p = 0.7, 0.95, 20, None
    generation.repetition_penalty, generation.max_completion_length, generation.logprobs = 1.1, 48, 0
    generation.structured_outputs_regex, generation.generation_kwargs = None, {"seed": 3}
    generation.vllm_client = client
    return generation


def test_an_early_request_asks_what_trls_server_mode_asks():
    """The sampling parameters of a prompt sent early are the ones TRL's own server-mode generation sends
    (read from the same object): a TRL change to them fails here, not silently in a run."""
    trl_client, early_client = RecordingClient(), RecordingClient()
    generation = _trl_generation(trl_client)
    prompts = [[5, 6, 7]] * 4 + [[8, 9]] * 4
    generation.generate(prompts, None, num_generations=4)
    rollouts = EarlyRollouts(
        early_client, server_sampling(generation, 4), tokenize=None, place_features=None, row=None, group_size=4,
        context=None,
    )  # fmt: skip
    batch = rollouts.open()
    completion_ids, logprobs = batch.take(prompts, None)
    rollouts.close()
    [trl_call] = trl_client.calls
    assert trl_call["prompts"] == [[5, 6, 7], [8, 9]]
    # one request per prompt, each with exactly TRL's parameters
    assert [c["prompts"] for c in early_client.calls] in ([[[5, 6, 7]], [[8, 9]]], [[[8, 9]], [[5, 6, 7]]])
    for call in early_client.calls:
        assert {k: v for k, v in call.items() if k != "prompts"} == {
            k: v for k, v in trl_call.items() if k != "prompts"
        }
    # the rollouts in the round's order, G per prompt, with the sampled token's log-prob
    assert completion_ids == [[5, 0], [5, 1], [5, 2], [5, 3], [8, 0], [8, 1], [8, 2], [8, 3]]
    assert logprobs[1] == [-0.5, -1.0]


def test_a_round_takes_each_prompt_from_its_request_in_flight_and_sends_the_rest(caplog):
    """Prompts sent early are matched by their token ids (the same prompt twice: two requests, taken in turn); a
    prompt not sent early (a filler) is sent when the round runs, and nothing is sent twice."""
    client = RecordingClient()
    rows = {"a": [1, 2], "b": [3], "c": [1, 2]}  # a and c: the same tokens

    def tokenize(prompts):
        return [list(rows[p]) for p in prompts], None, {}

    rollouts = EarlyRollouts(
        client, {"n": 2, "temperature": 1.0}, tokenize, place_features=None, row=lambda group: {"prompt": group.key},
        group_size=2, context=3,
    )  # fmt: skip
    batch = rollouts.open()
    for key in ("a", "b", "c"):
        batch.send(SimpleNamespace(key=key, response_prefix=None))
    assert batch.sent == 3 and rollouts.sent_total == 3 and batch.first_sent is not None
    filler = [9, 9]
    completion_ids, _ = batch.take([[1, 2]] * 2 + [[3]] * 2 + [[1, 2]] * 2 + [filler] * 2, None)
    assert batch.taken == 3
    assert sorted(c["prompts"][0] for c in client.calls) == [[1, 2], [1, 2], [3], filler]
    assert [ids[0] for ids in completion_ids] == [1, 1, 3, 3, 1, 1, 9, 9]
    # an early prompt the round does not hold is said (tokenized otherwise than the round: generated twice)
    batch = rollouts.open()
    batch.send(SimpleNamespace(key="b", response_prefix=None))
    with caplog.at_level("WARNING", logger="zppo_trl.early_rollouts"):
        batch.take([[1, 2]] * 2, None)
    assert "1 second-round prompt(s) sent early matched no prompt of the round" in caplog.text
    # a prompt that fills the server's context is left to the round (it sends a stand-in for it)
    rows["long"] = [4, 4, 4]
    batch = rollouts.open()
    batch.send(SimpleNamespace(key="long", response_prefix=None))
    assert batch.sent == 0
    rollouts.close()


def test_each_instance_is_handed_on_once_all_its_candidates_are_back():
    """Candidates return in any order; an instance is done when its last one is, with its results in order."""
    instances = [
        Reformulation("bcq", "q1", ("t", "s"), teacher_position=0),
        Reformulation("ncq", "q2", ("x",), wrong_answers=("4",)),
        Reformulation("ncq", "q3", ("y", "z"), wrong_answers=("1", "2")),
    ]
    done = []
    on_each = each_instance(instances, lambda inst, texts: done.append((inst.key, list(texts))))
    for index, result in [(4, "Z"), (2, "X"), (0, "T"), (3, None), (1, "S")]:
        on_each(index, result)
    assert done == [("q2", ["X"]), ("q3", [None, "Z"]), ("q1", ["T", "S"])]


def test_round_prompt_is_the_prompt_trls_scoring_makes_of_a_row():
    """A row's images go into its messages as TRL's scoring puts them (a column of them, even empty ones, makes the
    messages multimodal; a row with no images in a batch of such rows stays as it is)."""
    image = object()
    prompt = [{"role": "user", "content": "What is shown?"}]
    blocks = [{"role": "user", "content": [{"type": "text", "text": "What is shown?"}]}]
    assert round_prompt({"prompt": prompt, "images": [image]})[0]["content"][0] == {"type": "image", "image": image}
    assert (
        round_prompt({"prompt": prompt, "images": None}) == blocks == round_prompt({"prompt": prompt, "image": None})
    )
    assert round_prompt({"prompt": prompt, "images": []}) == prompt == round_prompt({"prompt": prompt})
    assert round_prompt({"prompt": prompt}) is not prompt  # a copy, as TRL's generation copies its prompts


@pytest.mark.integration
def test_a_compression_the_teacher_rejects_costs_its_instance_and_the_others_go_out_as_they_return(
    vllm_boxed_teacher_server,
):
    """Three instances, one whose candidate is beyond the teacher's context (rejected): the other two are handed on
    from the teacher client's thread as their compressions return, exactly as the whole build renders them; the
    rejected one is dropped and counted, as when the round is sent whole."""
    teacher = vllm_boxed_teacher_server
    instances = [
        Reformulation("bcq", "q1", ("\\boxed{3}", "\\boxed{4}"), teacher_position=0),
        Reformulation("bcq", "q2", ("\\boxed{5}", "word " * 5000 + "\\boxed{6}"), teacher_position=1),
        Reformulation("ncq", "q3", ("\\boxed{1}",), wrong_answers=("1",)),
    ]
    args = SimpleNamespace(
        compress_candidates=True, compression_max_tokens=32, teacher_temperature=0.0, teacher_top_p=1.0,
        compression_extra_body=None,
    )  # fmt: skip
    ready, threads = [], set()

    def on_ready(group):
        ready.append(group)
        threads.add(threading.current_thread().name)

    augmentation = CandidateReformulation(["bcq", "ncq"])
    with TeacherClient(teacher.base_url, teacher.model, backoff_base=0.01, backoff_max=0.05) as client:
        metrics: dict = {}
        built = augmentation.build(instances, client, args, metrics, ready=on_ready)
        serial = augmentation.build(instances, client, args, {})
        stats = client.stats()
    assert [g.key for g in built.groups] == ["q1", "q3"] and built.failures == 1 and stats["failed"] == 2
    assert sorted(ready, key=lambda g: g.key) == built.groups == serial.groups  # the same groups, blocks and all
    assert threads == {"zppo-teacher"}  # handed on by the teacher's client as each returned, not after the build
    assert metrics["time/compression_s"] > 0


def test_pipelining_is_off_where_no_server_batches_what_arrives():
    from zppo_trl.early_rollouts import early_rollouts

    args = SimpleNamespace(pipeline_second_round=True, vllm_max_model_length=None)
    common = dict(tokenize=None, row=None, group_size=4)
    assert early_rollouts(args, None, True, sampled=True, custom=False, **common) is None  # rollouts in the trainer
    generation = _trl_generation(RecordingClient())
    assert early_rollouts(args, generation, True, sampled=False, custom=False, **common) is None  # GRPO†
    assert early_rollouts(args, generation, True, sampled=True, custom=True, **common) is None  # a rollout_func
    off = SimpleNamespace(pipeline_second_round=False, vllm_max_model_length=None)
    assert early_rollouts(off, generation, True, sampled=True, custom=False, **common) is None
    on = early_rollouts(args, generation, True, sampled=True, custom=False, **common)
    assert isinstance(on, EarlyRollouts) and on.client is generation.vllm_client
    on.close()
