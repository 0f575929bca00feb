"""TeacherClient: pure parsers and payloads, then real servers (see conftest.py).

The live tests run against both servers the client must work with: `transformers serve`
(which ignores ``n``, so the client tops up with single requests) and vLLM's CPU engine, the
production teacher server (which honours ``n``).

The served models are tiny and random: their replies are noise, so live tests assert what
the protocol makes observable (reply counts, token counts the server reports, counters),
and the parsers are tested on tables of replies.
"""

from __future__ import annotations

import base64
import io
import logging
from concurrent.futures import CancelledError, Future

import pytest
from PIL import Image
from servers import free_port

from zppo_trl.prompts import render_compression
from zppo_trl.teacher import TeacherClient, extract_summary, parse_verdict, to_openai_messages

SECRET = "sk-zppo-test-secret-0123456789"


def fast_client(base_url: str, model: str, **kwargs) -> TeacherClient:
    """A client with test-sized backoff (the production default waits seconds between retries)."""
    kwargs.setdefault("backoff_base", 0.01)
    kwargs.setdefault("backoff_max", 0.05)
    return TeacherClient(base_url, model, **kwargs)


def png_bytes(size: int, colour=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def decode_data_url(url: str) -> tuple[str, bytes]:
    header, data = url.split(",", 1)
    assert header.startswith("data:") and header.endswith(";base64")
    return header[5:-7], base64.b64decode(data)


# ---------------------------------------------------------------- pure: parsers


@pytest.mark.parametrize(
    "reply, verdict",
    [
        ('{"verdict": "correct"}', True),
        ('{"verdict": "wrong"}', False),
        ('{"verdict":"correct"}', True),
        ('  {\n  "verdict" :\t"correct"\n}\n', True),  # JSON whitespace is tolerated
        ('{"verdict": "Correct"}', None),
        ('{"verdict": "CORRECT"}', None),
        ('{"verdict": "right"}', None),
        ('{"verdict": "correct", "reason": "matches"}', None),
        ('{"verdict": "wrong", "verdict": "correct"}', None),  # duplicate keys are ambiguous
        ('{"Verdict": "correct"}', None),
        ('{"verdict": ["correct"]}', None),
        ('{"verdict": true}', None),
        ('["verdict", "correct"]', None),
        ('[["verdict", "correct"]]', None),
        ('"correct"', None),
        ("correct", None),
        ('```json\n{"verdict": "correct"}\n```', None),
        ('The answer matches. {"verdict": "correct"}', None),
        ('{"verdict": "correct"} because it matches', None),
        ('<think>same</think>{"verdict": "correct"}', None),
        ("{'verdict': 'correct'}", None),
        ('{"verdict": "correct"', None),
        ("", None),
        (None, None),
    ],
)
def test_parse_verdict_is_strict(reply, verdict):
    assert parse_verdict(reply) is verdict


@pytest.mark.parametrize(
    "reply, text, tagged",
    [
        ("<summary>x = 5, so \\boxed{5}</summary>", "x = 5, so \\boxed{5}", True),
        ("Sure.\n<summary>\n  a\n  b\n</summary>\nDone.", "a\n  b", True),
        # the reply may echo the rule text first: the last non-empty pair wins
        ("Summary goes in <summary>...</summary> tags.\n<summary>real</summary>", "real", True),
        ("<summary></summary><summary> kept </summary><summary> </summary>", "kept", True),
        ("  no tags at all \\boxed{3}  ", "no tags at all \\boxed{3}", False),
        ("<summary>cut at the token cap", "cut at the token cap", False),
        # thinking never becomes a candidate: closed blocks go, a template-opened block's
        # text before "</think>" goes, and a reply cut off inside its thinking is unusable
        ("<think>plan it</think>\n<summary>s \\boxed{2}</summary>", "s \\boxed{2}", True),
        ("reasoning the template opened\n</think>\n\n<summary>t</summary>", "t", True),
        (
            "<think>Summary goes in <summary>x</summary>, fine</think>plain summary \\boxed{1}",
            "plain summary \\boxed{1}",
            False,
        ),
        ("<think>the step-by-step plan, then the token cap hits", None, False),
        ("<think>thinks</think>   ", None, False),
        ("the template opened it; still thinking </think>", None, False),
        ("", None, False),
    ],
)
def test_extract_summary(reply, text, tagged):
    assert extract_summary(reply) == (text, tagged)


# ---------------------------------------------------------------- pure: payloads and arguments


def test_images_become_data_url_parts_and_the_input_is_untouched():
    image = Image.new("RGB", (8, 6), (1, 2, 3))
    raw = png_bytes(5)
    conversation = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "colour?"}, raw]},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://example.org/a.png", "detail": "low"}}],
        },
    ]
    messages = to_openai_messages(conversation)

    assert messages[0] == {"role": "system", "content": "be brief"}
    first, text, second = messages[1]["content"]
    assert text == {"type": "text", "text": "colour?"}
    mime, data = decode_data_url(first["image_url"]["url"])
    assert first["type"] == "image_url" and mime == "image/png"
    assert Image.open(io.BytesIO(data)).getpixel((0, 0)) == (1, 2, 3)
    assert decode_data_url(second["image_url"]["url"]) == ("image/png", raw)  # bytes are sent as they are
    assert messages[2]["content"][0]["image_url"] == {"url": "https://example.org/a.png", "detail": "low"}
    assert conversation[1]["content"][0]["image"] is image  # the caller's conversation is not rewritten
    assert to_openai_messages("hi") == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "conversation, fragment",
    [
        ([{"role": "user", "content": [b"not an image"]}], "conversation[0].content[0]"),
        ([{"role": "user", "content": [{"type": "image"}]}], "placeholder"),
        ([{"content": "no role"}], "conversation[0]"),
        ({"role": "user", "content": "a message, not a list"}, "conversation"),
        ([], "conversation"),
    ],
)
def test_malformed_conversations_raise_value_error(conversation, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        to_openai_messages(conversation)


def test_bad_arguments_raise_value_error_naming_them():
    url = f"http://127.0.0.1:{free_port()}/v1"  # never contacted: arguments are checked first
    for kwargs, name in [
        (dict(base_url="localhost:8000"), "base_url"),
        (dict(model=""), "model"),
        (dict(max_concurrency=0), "max_concurrency"),
        (dict(timeout=0), "timeout"),
        (dict(max_retries=-1), "max_retries"),
        (dict(extra_body=["x"]), "extra_body"),
    ]:
        with pytest.raises(ValueError, match=name):
            TeacherClient(**{"base_url": url, "model": "m", **kwargs})
    with TeacherClient(url, "m") as client:
        for call, name in [
            (lambda: client.sample("hi", n=2), "conversations"),
            (lambda: client.sample(["hi"], n=0), "n"),
            (lambda: client.sample(["hi"], n=True), "n"),
            (lambda: client.sample(["hi"], max_tokens=0), "max_tokens"),
            (lambda: client.sample(["hi"], temperature=-0.1), "temperature"),
            (lambda: client.sample(["hi"], top_p=0.0), "top_p"),
            (lambda: client.sample_async([[{"role": "user", "content": [3]}]]), r"conversations\[0\]"),
            (lambda: client.compress(["ok", None]), r"texts\[1\]"),
            (lambda: client.judge([{"question": "q", "response": "r"}]), r"items\[0\]"),
            (lambda: client.judge([{"question": "q", "response": None, "ground_truth": "1"}]), r"items\[0\]"),
        ]:
            with pytest.raises(ValueError, match=name):
                call()
        assert client.stats()["requests"] == 0
        assert client.sample([]) == [] and client.compress([]) == [] and client.judge([]) == []


# ---------------------------------------------------------------- live: transformers serve and vLLM


@pytest.mark.integration
def test_n_replies_per_conversation_with_top_up(teacher_server):
    with fast_client(teacher_server.base_url, teacher_server.model) as client:
        future = client.sample_async(
            ["What is 6*7?", [{"role": "user", "content": "Name a prime."}], "Hi"], n=3, max_tokens=4
        )
        assert isinstance(future, Future)
        replies = future.result(timeout=120)
        assert [len(r) for r in replies] == [3, 3, 3]
        assert all(isinstance(text, str) for group in replies for text in group)
        first = client.stats(reset=True)
        # transformers serve ignores n: each conversation got 1 choice and 2 top-up requests
        assert first["requests"] == 9 and first["replies"] == 9 and first["top_ups"] == 6
        assert first["succeeded"] == 9 and first["failed"] == 0
        assert 0 < first["completion_tokens"] <= 9 * 4 and first["prompt_tokens"] > 0
        assert first["latency_max_s"] >= first["latency_mean_s"] > 0

        # once seen, the server gets n single requests straight away (no wasted n-request)
        assert [len(r) for r in client.sample(["a", "b"], n=2, max_tokens=2)] == [2, 2]
        second = client.stats()
        assert second["requests"] == 4 and second["top_ups"] == 4


@pytest.mark.integration
def test_n_replies_come_in_one_request_from_vllm(vllm_teacher_server):
    with fast_client(vllm_teacher_server.base_url, vllm_teacher_server.model) as client:
        replies = client.sample(
            ["What is 6*7?", [{"role": "user", "content": "Name a prime."}], "Hi"], n=4, max_tokens=4
        )
        stats = client.stats()
    assert [len(r) for r in replies] == [4, 4, 4]
    assert all(isinstance(text, str) for group in replies for text in group)
    # vLLM honours n: one request per conversation, no top-ups
    assert stats["requests"] == 3 and stats["replies"] == 12 and stats["top_ups"] == 0 and stats["failed"] == 0
    assert 0 < stats["completion_tokens"] <= 12 * 4


@pytest.mark.integration
def test_extra_body_reaches_the_server(live_teacher):
    with fast_client(live_teacher.base_url, live_teacher.model) as client:
        client.sample(["a", "b", "c"], n=1, max_tokens=12)
        plain = client.stats(reset=True)["completion_tokens"]
        # extra_body is merged into the request body last, over the client's own max_tokens
        client.sample(["a", "b", "c"], n=1, max_tokens=12, extra_body={"max_tokens": 1})
        capped = client.stats()["completion_tokens"]
    assert capped == 3 < plain


@pytest.mark.integration
def test_images_reach_a_vision_language_server(vlm_server):
    """Images are sent as data URLs; the served tiny VLM turns each into size-dependent tokens.

    (The text-only model's server silently drops image parts, so the VLM server is used.)
    """

    def prompt_tokens(client, content) -> int:
        assert [len(r) for r in client.sample([[{"role": "user", "content": content}]], n=1, max_tokens=1)] == [1]
        return client.stats(reset=True)["prompt_tokens"]

    with fast_client(vlm_server.base_url, vlm_server.model) as client:
        text_only = prompt_tokens(client, "What colour is it?")
        with_pil = prompt_tokens(
            client, [{"type": "image", "image": Image.new("RGB", (64, 64), "red")}, "What colour is it?"]
        )
        with_bytes = prompt_tokens(client, [png_bytes(64), {"type": "text", "text": "What colour is it?"}])
        small = prompt_tokens(client, [png_bytes(32), "What colour is it?"])
    assert with_pil == with_bytes > small > text_only  # the server decoded the pixels


@pytest.mark.integration
def test_compress_live(live_teacher):
    texts = ["<think>long exploration</think> 6*7 = 42, so \\boxed{42}", "Try 3. No. Try 5: works. \\boxed{5}"]
    with fast_client(live_teacher.base_url, live_teacher.model) as client:
        out = client.compress(texts, max_tokens=6)
        stats = client.stats()
    # The random model never closes a <summary> pair: a reply comes back untagged, or None where
    # nothing is left once its (random) think tokens are removed; never an empty string.
    assert len(out) == 2 and all(text is None or (isinstance(text, str) and text) for text in out)
    assert stats["compressed"] + stats["unusable"] == 2 and stats["untagged"] == stats["compressed"]
    assert stats["unusable"] == out.count(None) and stats["failed"] == 0
    assert stats["completion_tokens"] <= 2 * 6
    # the request carried the whole compression prompt
    assert stats["prompt_tokens"] >= 2 * len(render_compression(texts[1]).split())


@pytest.mark.integration
def test_judge_live_sends_the_boxed_span(live_teacher):
    reasoning = "We add the numbers one by one and check the carry each time. " * 20
    item = {"question": "What is 6*7?", "ground_truth": "42", "options": None}
    with fast_client(live_teacher.base_url, live_teacher.model) as client:
        verdicts = client.judge([{**item, "response": reasoning + "So \\boxed{42}."}], max_tokens=8)
        boxed = client.stats(reset=True)
        client.judge([{**item, "response": reasoning + "So 42."}], max_tokens=8)
        full = client.stats()
    assert verdicts == [False]  # a random model does not write {"verdict": "correct"}
    assert boxed["judged"] == 1 and boxed["verdict_unparsed"] == 1 and boxed["judged_correct"] == 0
    # with a boxed span the judge reads only "42"; without one, the whole response
    assert full["prompt_tokens"] - boxed["prompt_tokens"] > len(reasoning.split())


@pytest.mark.integration
def test_routing_reward_calls_the_judge_only_on_zeros(live_teacher):
    from zppo_trl.rewards import judged_accuracy_reward

    with fast_client(live_teacher.base_url, live_teacher.model) as client:
        reward = judged_accuracy_reward(client)
        scores = reward(
            completions=["6*7 is \\boxed{42}", "6*7 is \\boxed{41}", "I think it is forty-two"],
            answer=["42", "42", "42"],
            question=["What is 6*7?"] * 3,
        )
        stats = client.stats()
    assert scores == [1.0, 0.0, 0.0]
    assert stats["requests"] == 2 and stats["judged"] == 2  # the graded-correct one never reached the judge


@pytest.mark.integration
def test_health(live_teacher, caplog):
    caplog.set_level(logging.WARNING, logger="zppo_trl.teacher")
    assert TeacherClient(live_teacher.base_url, live_teacher.model).health()
    assert not [r for r in caplog.records if r.name == "zppo_trl.teacher"]

    assert not TeacherClient(live_teacher.base_url, "no-such-model").health()
    assert (
        "HTTP 400" in caplog.text or "HTTP 404" in caplog.text
    ) and "no-such-model" in caplog.text  # transformers / vLLM
    caplog.clear()
    assert not TeacherClient(live_teacher.base_url.removesuffix("/v1"), live_teacher.model).health()
    assert "HTTP 404" in caplog.text and "/v1" in caplog.text


@pytest.mark.integration
def test_per_request_timeout(live_teacher):
    with fast_client(live_teacher.base_url, live_teacher.model, timeout=0.05, max_retries=1) as client:
        assert client.sample(["Write a long story."], n=1, max_tokens=1000) == [[]]
        stats = client.stats()
    assert stats["failed"] == 1 and stats["retries"] == 1 and stats["succeeded"] == 0


def test_unreachable_url_degrades_without_raising(caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("ZPPO_TEST_TEACHER_KEY", SECRET)
    url = f"http://127.0.0.1:{free_port()}/v1"
    with fast_client(url, "m", max_retries=2, api_key_env="ZPPO_TEST_TEACHER_KEY") as client:
        assert SECRET not in repr(client) and "<set>" in repr(client)
        assert client.sample(["hi", "there"], n=2, max_tokens=4) == [[], []]
        assert client.compress(["text"]) == [None]
        assert client.judge([{"question": "q", "response": "\\boxed{1}", "ground_truth": "1"}]) == [
            None
        ]  # no verdict, not a wrong one
        assert not client.health()
        stats = client.stats()
    # a failed n-request is not topped up: single requests would only fail too
    assert stats["requests"] == 4 and stats["failed"] == 4 and stats["retries"] == 8 and stats["top_ups"] == 0
    assert stats["succeeded"] == 0 and stats["in_flight"] == 0
    assert "cannot connect" in caplog.text and "failed" in caplog.text
    assert SECRET not in caplog.text


@pytest.mark.integration
def test_close_cancels_pending_work_and_the_client_restarts(live_teacher):
    client = fast_client(live_teacher.base_url, live_teacher.model, max_concurrency=1)
    future = client.sample_async([f"q{i}" for i in range(50)], n=1, max_tokens=32)
    client.close()
    with pytest.raises(CancelledError):
        future.result(timeout=30)
    assert [len(r) for r in client.sample(["again"], n=1, max_tokens=2)] == [1]
    client.close()


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_compression_cut_off_inside_thinking_is_a_failure_not_a_candidate(backend, request):
    # The boxed teacher answers the compression prompt "<think> </think> <summary> ... </summary>";
    # transformers serve moves the think part out of the content, as vLLM's reasoning parser does;
    # vLLM without one (as the recipes serve it) drops the think tokens, special in the tiny
    # tokenizer, from the text. Either way a reply cut off inside it leaves nothing usable.
    boxed_teacher_server = request.getfixturevalue(
        "vllm_boxed_teacher_server" if backend == "vllm" else "boxed_teacher_server"
    )
    source = "\\boxed{42}"
    with fast_client(boxed_teacher_server.base_url, boxed_teacher_server.model) as client:
        full = client.compress([source], max_tokens=64, temperature=0.0)
        cut = client.compress([source, source], max_tokens=2, temperature=0.0)
        stats = client.stats()
    assert full == ["The attempt works it out step by step."]
    assert cut == [None, None]  # the 2-token cap lands inside "<think> </think>": unusable, not ""
    assert stats["unusable"] == 2 and stats["compressed"] == 1 and stats["failed"] == 0


@pytest.mark.integration
def test_token_logprobs_from_vllm_are_the_models_own_log_prob_of_each_sampled_token(vllm_teacher_server):
    """What the hybrid RL rows read: the server's prompt_logprobs entry of each completion token, teacher-forced,
    equal to the model's own log-softmax at the position that predicts it, and to the same token's entry in the
    top-k where it ranks there."""
    import torch
    from transformers import AutoModelForCausalLM

    sequences = [[5, 17, 42, 99, 7, 8, 120], [3, 4, 250, 11]]
    prompt_lengths = [3, 2]
    with fast_client(vllm_teacher_server.base_url, vllm_teacher_server.model) as client:
        got = client.token_logprobs_async(sequences, prompt_lengths).result()
        top = client.sequence_logprobs_async(sequences, prompt_lengths, top_k=5).result()
        assert client.stats()["failed"] == 0
    model = AutoModelForCausalLM.from_pretrained(vllm_teacher_server.model_dir).eval()
    for sequence, n, logps, (ids, top_logps) in zip(sequences, prompt_lengths, got, top):
        assert len(logps) == len(sequence) - n
        with torch.no_grad():
            own = torch.log_softmax(model(torch.tensor([sequence])).logits[0].double(), -1)
        expected = [float(own[t - 1, sequence[t]]) for t in range(n, len(sequence))]
        assert logps == pytest.approx(expected, abs=2e-3)
        for j, token in enumerate(sequence[n:]):
            if token in ids[j]:
                assert logps[j] == pytest.approx(top_logps[j][ids[j].index(token)], abs=1e-6)


@pytest.mark.integration
def test_token_logprobs_from_a_server_that_cannot_score_token_ids_fail_and_are_counted(teacher_server, caplog):
    """`transformers serve` refuses a completions request of token ids (HTTP 422): the sequence's result is None,
    the failure is counted, not retried (a client error), and the warning names the server and the error."""
    with fast_client(teacher_server.base_url, teacher_server.model) as client:
        with caplog.at_level(logging.WARNING):
            got = client.token_logprobs_async([[5, 6, 7]], [1]).result()
        stats = client.stats()
    assert got == [None] and stats["failed"] == 1 and stats["retries"] == 0
    assert f"teacher log-probs: 1 request(s) to {teacher_server.base_url} failed (last error: HTTP 4" in caplog.text


def test_token_logprobs_refuse_a_sequence_without_a_completion_token():
    with fast_client("http://127.0.0.1:1/v1", "m") as client:
        with pytest.raises(ValueError, match=r"sequences\[1\] has no completion token after its 2 prompt tokens"):
            client.token_logprobs_async([[1, 2, 3], [4, 5]], [2, 2])
        with pytest.raises(ValueError, match="2 sequences but 1 prompt lengths"):
            client.token_logprobs_async([[1, 2, 3], [4, 5]], [2])


def test_a_reasoning_trace_the_server_split_out_is_put_back_in_front_of_the_reply():
    """`transformers serve` (and vLLM with a reasoning parser) move the text before `</think>` (all of it, when the
    reply never closes it) into `reasoning_content`: the client hands on the reply as a server without a parser
    would send it."""
    from openai.types.chat import ChatCompletionMessage

    from zppo_trl.teacher import reply_text, strip_thinking

    split = ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": " \\boxed{7}", "reasoning_content": " 3 + 4 "}
    )
    assert reply_text(split) == "<think> 3 + 4 </think> \\boxed{7}"
    assert reply_text(split, reasoning=False) == " \\boxed{7}"  # a judge's verdict: the content, as it was
    assert strip_thinking(reply_text(split)).strip() == "\\boxed{7}"
    only_reasoning = ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": "", "reasoning_content": "w9163}"}
    )
    assert reply_text(only_reasoning) == "<think>w9163}</think>"
    plain = ChatCompletionMessage.model_validate({"role": "assistant", "content": "<think> a </think> b"})
    assert reply_text(plain) == "<think> a </think> b"
    assert reply_text(ChatCompletionMessage.model_validate({"role": "assistant", "content": None})) == ""


@pytest.mark.integration
def test_a_server_that_splits_out_the_reasoning_still_gives_the_whole_reply(boxed_text_teacher_dir, tmp_path):
    """`transformers serve` with its own reply parser on (as vLLM with ``--reasoning-parser``): the boxed teacher's
    think block arrives in ``reasoning_content``, and the client hands on the reply with it back in front, so the
    graders see the box and ``strip_thinking`` the answer; ``reasoning=False`` (a judge's verdict) reads the
    content alone. Fails if the client dropped the trace or returned only the content."""
    import json
    import urllib.request

    from boxed_models import TOY_QUESTIONS, toy_conversation
    from servers import Server

    from zppo_trl.rewards import extract_boxed
    from zppo_trl.teacher import strip_thinking

    server = Server(boxed_text_teacher_dir, log_dir=tmp_path, split_reasoning=True).start()
    try:
        conversation = toy_conversation(TOY_QUESTIONS[0])
        request = urllib.request.Request(
            f"{server.base_url}/chat/completions",
            data=json.dumps({"model": server.model, "messages": conversation, "max_tokens": 32}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            message = json.loads(response.read())["choices"][0]["message"]
        assert message["reasoning_content"] and "<think>" not in message["content"]  # the premise: it splits
        with fast_client(server.base_url, server.model) as client:
            (replies,) = client.sample([conversation], n=3, max_tokens=32)
            (contents,) = client.sample([conversation], n=2, max_tokens=32, reasoning=False)
    finally:
        server.stop()
    assert len(replies) == 3 and len(contents) == 2
    for reply in replies:
        assert reply.startswith("<think>") and "</think>" in reply
        assert extract_boxed(strip_thinking(reply)) is not None
    assert all("<think>" not in text and extract_boxed(text) is not None for text in contents)
