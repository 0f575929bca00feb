"""The second round pipelined behind its compressions: each BCQ/NCQ prompt goes to the student's server as soon as
its own candidates are compressed (``ZPPOConfig.pipeline_second_round``).

Algorithm 1 makes the second round wait for the prompts it samples, and a prompt waits for its candidates'
compressions; it does not make any prompt wait for another's. Sent as one request once every compression is back
(TRL's server mode), the round starts only after the slowest compression. Here a step-5 part that builds its groups
one by one (:meth:`zppo_trl.augmentations.Source.build`'s ``ready``) hands each to an :class:`EarlyBatch` the moment
it is built; the batch renders its row as the round will, tokenizes it with TRL's own hook and posts it alone to the
server, which batches what arrives (vLLM's continuous batching). When the round runs, TRL's generation hook takes
each prompt's rollouts from its request in flight (:meth:`EarlyBatch.take`), matched by token ids, and sends what
was not sent early (a filler, a prompt the part did not stream) then.

Only the time at which each prompt reaches the server changes: the prompts, their groups and order, the caps and the
sampling parameters are the round's own (:func:`server_sampling` reads them from TRL's ``VLLMGeneration`` as its
server mode sends them; tests/test_early_rollouts.py holds the two to the same request). Every rank sends its own
prompts through its own client (TRL's server mode sends every rank's through the main process), so a pipelined round
takes no collective.

In colocate mode and with rollouts generated in the trainer there is no server to batch what arrives: the round is
one generation call on the trainer's own device, and the compressions are waited for first.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl.data_utils import prepare_multimodal_messages

__all__ = ["EarlyBatch", "EarlyRollouts", "early_rollouts", "round_prompt", "server_sampling"]

logger = logging.getLogger(__name__)


def round_prompt(row: Mapping) -> Any:
    """A dataset row's prompt as TRL's scoring hands it to its generation: a copy, made multimodal with the row's
    images (``images``, or one ``image``) where the row has that column, as TRL does for a batch of such rows (a row
    whose ``images`` is empty is left as it is, as TRL leaves a batch of them; mixed with rows that have images, TRL
    converts it too, and the round's own request is used for it, :meth:`EarlyBatch.take`)."""
    prompt = copy.deepcopy(row["prompt"])
    if "images" in row:
        images = row["images"]
    elif "image" in row:
        images = [row["image"]] if row["image"] is not None else None
    else:
        return prompt
    return prompt if images == [] else prepare_multimodal_messages(prompt, images=images)


def server_sampling(generation: Any, num_generations: int) -> dict[str, Any]:
    """The sampling parameters TRL's ``VLLMGeneration.generate`` passes its server client for a round of
    ``num_generations`` rollouts per prompt, read from the same attributes of ``generation``."""
    return {
        "n": num_generations,
        "repetition_penalty": generation.repetition_penalty,
        "temperature": generation.temperature,
        "top_p": generation.top_p,
        "top_k": generation.top_k,
        "min_p": 0.0 if generation.min_p is None else generation.min_p,
        "max_tokens": generation.max_completion_length,
        "logprobs": generation.logprobs,
        "structured_outputs_regex": generation.structured_outputs_regex,
        "generation_kwargs": generation.generation_kwargs,
    }


class EarlyRollouts:
    """Opens one :class:`EarlyBatch` per second round; ``sent_total`` counts the groups this rank sent early.

    Args:
        client: this rank's client of the student's server (TRL's ``VLLMClient``: ``generate``, ``image_features``).
        sampling: the round's sampling parameters (:func:`server_sampling`).
        tokenize: TRL's ``_tokenize_prompts`` (prompts -> token ids, images, multimodal fields), as its generation
            tokenizes a round's prompts.
        place_features: ``(features, prompt_ids) -> features`` pointing a prompt's image features at its image tokens
            (TRL's ``VLLMGeneration._place_features``).
        row: a built group -> the dataset row the round samples it with (:meth:`zppo_trl.rounds.Rounds.built_row`).
        group_size: G_S; ``context``: the server's context in tokens (None: unknown). A prompt that fills it is
            left to the round, which sends a stand-in for it.
        workers: requests in flight at once.
    """

    def __init__(
        self,
        client: Any,
        sampling: Mapping[str, Any],
        tokenize: Callable[[list], tuple],
        place_features: Callable[[Any, list[int]], Any],
        row: Callable[[Any], Mapping],
        *,
        group_size: int,
        context: int | None,
        workers: int = 64,
    ):
        self.client, self.sampling, self.tokenize = client, dict(sampling), tokenize
        self.place_features, self.row, self.group_size, self.context = place_features, row, group_size, context
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zppo-early")
        self.sent_total = 0  # groups this rank sent before their round, over the run

    def open(self) -> EarlyBatch:
        """A batch for the next second round."""
        return EarlyBatch(self)

    def generate(self, prompt_ids: list[int], images: list | None) -> dict:
        """One prompt's rollouts from the server, as TRL's server mode asks for a batch of them."""
        features = None
        if images:
            features = [self.place_features(self.client.image_features([images])[0], prompt_ids)]
        return self.client.generate(prompts=[prompt_ids], features=features, **self.sampling)

    def submit(self, prompt_ids: list[int], images: list | None) -> concurrent.futures.Future:
        return self._pool.submit(self.generate, prompt_ids, images)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class EarlyBatch:
    """One second round's prompts sent as they are built (:meth:`send`, the step-5 part's ``ready``), and the round's
    rollouts taken from them (:meth:`take`). ``sent`` counts the groups sent early, ``taken`` those of the round
    taken from them; ``first_sent`` is when the first left (``time.perf_counter``; None: none did)."""

    def __init__(self, rollouts: EarlyRollouts):
        self.rollouts = rollouts
        self._in_flight: dict[tuple[int, ...], list[concurrent.futures.Future]] = defaultdict(list)
        self._lock = threading.Lock()
        self.sent = 0
        self.taken = 0  # the round's groups taken from an early request
        self.first_sent: float | None = None

    def send(self, group: Any) -> None:
        """Send one built group's prompt now (called from the thread its last compression returned on)."""
        if group.response_prefix:
            return  # a prefix ends its prompt in the round's own hook
        prompt_ids, images, _ = self.rollouts.tokenize([round_prompt(self.rollouts.row(group))])
        prompt_ids, images = list(prompt_ids[0]), images[0] if images else None
        context = self.rollouts.context
        if context and len(prompt_ids) >= context:
            return  # a prompt that fills the server's context gets a stand-in in the round's own hook
        future = self.rollouts.submit(prompt_ids, images)
        with self._lock:
            self._in_flight[tuple(prompt_ids)].append(future)
            self.sent += 1
            self.rollouts.sent_total += 1
            self.first_sent = self.first_sent or time.perf_counter()

    def take(self, prompt_ids: Sequence[Sequence[int]], images: Sequence | None) -> tuple[list, list]:
        """The round's rollouts for its prompts (``group_size`` rows per prompt, as TRL's generation hook gets them):
        each prompt's from the request sent early for the same tokens, the others' sent now. Returns the completion
        ids and the sampled tokens' log-probs, one list per rollout."""
        G = self.rollouts.group_size
        futures = []
        with self._lock:
            for index in range(0, len(prompt_ids), G):
                ids = list(prompt_ids[index])
                waiting = self._in_flight.get(tuple(ids))
                if waiting:
                    futures.append(waiting.pop(0))
                    self.taken += 1
                else:
                    futures.append(self.rollouts.submit(ids, images[index] if images is not None else None))
            unmatched = sum(len(waiting) for waiting in self._in_flight.values())
        if unmatched:  # tokenized otherwise than TRL's hook tokenized the round: generated twice, never wrong
            logger.warning(
                "%d second-round prompt(s) sent early matched no prompt of the round and were sent again with it: "
                "the early send tokenized them otherwise than the round did",
                unmatched,
            )
        completion_ids, logprobs = [], []
        for future in futures:
            output = future.result()
            completion_ids.extend(output["completion_ids"])
            logprobs.extend([[top[0] for top in token] for token in output["logprobs"]])  # the sampled token's
        return completion_ids, logprobs


def early_rollouts(
    args: Any,
    generation: Any,
    main_process: bool,
    *,
    sampled: bool,
    custom: bool,
    tokenize: Callable[[list], tuple],
    row: Callable[[Any], Mapping],
    group_size: int,
) -> EarlyRollouts | None:
    """The run's :class:`EarlyRollouts`, or None where its second rounds are sent whole: ``pipeline_second_round``
    off, rollouts not on a server (``generation``: TRL's ``VLLMGeneration`` in server mode, else None), a row without
    a sampled second round (``sampled``), or generation TRL hands to user code (``custom``: a ``rollout_func``, tools,
    environments)."""
    if not (args.pipeline_second_round and generation is not None and sampled and not custom):
        return None
    from .student_server import rank_client

    return EarlyRollouts(
        rank_client(generation, main_process),
        server_sampling(generation, group_size),
        tokenize,
        generation._place_features,
        row,
        group_size=group_size,
        context=args.vllm_max_model_length,
    )
