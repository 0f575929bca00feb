"""Control-plane cost of one ZPPO rollout step at paper scale (no model, no teacher).

384 new + 96 replayed questions, G_S = 8, a buffer holding 10,000 residents, up to 96
reformulations, I = 4 partitions: select_hard + plan_reformulations + partitioning +
two-step advantages per partition + buffer update. Target: median <= 20 ms.

    python benchmarks/bench_control_plane.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from zppo_trl.advantages import partition_groups, two_step_advantages
from zppo_trl.reformulate import augment_limit, plan_reformulations, select_hard
from zppo_trl.replay import PromptReplayBuffer, replay_count

NUM_NEW, G_S, G_T, PARTITIONS, CAPACITY = 384, 8, 4, 4, 10_000


def rollout(rng: random.Random, answer: int, correct: bool) -> str:
    filler = "Let me reason about the quantities step by step. " * rng.randint(20, 80)
    return f"<think>{filler}</think> The answer is \\boxed{{{answer if correct else answer + rng.randint(1, 3)}}}."


def make_step(seed: int):
    """Inputs of one step: buffer at capacity, replay draw, plain groups, teacher pool."""
    rng = random.Random(seed)
    buffer = PromptReplayBuffer(capacity=CAPACITY)
    buffer.update({100_000 + i: 0.0 for i in range(CAPACITY)})
    replayed = buffer.sample(replay_count(NUM_NEW, 0.25, len(buffer)), rng)
    questions = list(range(NUM_NEW)) + replayed
    rewards: dict[int, list[float]] = {}
    student_wrong: dict[int, list[str]] = {}
    teacher_correct: dict[int, list[str]] = {}
    for q in questions:
        k = rng.choices(range(G_S + 1), weights=[30, 10, 8, 6, 6, 6, 8, 10, 16])[0]
        rewards[q] = [1.0] * k + [0.0] * (G_S - k)
        student_wrong[q] = [
            rollout(rng, q, False) if rng.random() > 0.2 else "<think>truncated" for _ in range(G_S - k)
        ]
        teacher_correct[q] = [rollout(rng, q, True) for _ in range(G_T) if rng.random() < 0.4]
    return buffer.state_dict(), questions, rewards, student_wrong, teacher_correct


def control_plane(buffer: PromptReplayBuffer, questions, rewards, student_wrong, teacher_correct, rng):
    accuracy = {q: sum(rewards[q]) / G_S for q in questions}
    limit = augment_limit(NUM_NEW, 0.25)
    hard = select_hard(accuracy, limit, threshold=0.5)
    plan = plan_reformulations(hard, teacher_correct, student_wrong, limit, rng=rng)
    # reformulated groups get student rewards too (simulated: shifted plain rewards)
    group_ids, flat, strata = [], [], []
    for q in questions:
        group_ids += [("plain", q)] * G_S
        flat += rewards[q]
        strata += ["new" if q < NUM_NEW else "replay"] * G_S
    for r in plan:
        group_ids += [(r.kind, r.key)] * G_S
        flat += sorted(rewards[r.key], reverse=True)[:-1] + [1.0]
        strata += [r.kind] * G_S
    partitions = partition_groups(group_ids, PARTITIONS, rng=rng, strata=strata)
    for rows in partitions:
        two_step_advantages([flat[i] for i in rows], [group_ids[i] for i in rows])
    events = buffer.update(accuracy)
    return len(hard), len(plan), events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    timings = []
    for i in range(args.repeats):
        state, *inputs = make_step(i)
        buffer = PromptReplayBuffer()
        buffer.load_state_dict(state)
        start = time.perf_counter()
        hard, planned, events = control_plane(buffer, *inputs, random.Random(i))
        timings.append((time.perf_counter() - start) * 1e3)
    timings.sort()
    print(
        f"control plane, {NUM_NEW} new + {len(inputs[0]) - NUM_NEW} replayed questions, G_S={G_S}, "
        f"buffer {CAPACITY}, I={PARTITIONS}"
    )
    print(
        f"last step: {hard} hard (pre-cap), {planned} reformulations (post-cap), "
        f"{len(events.admitted)} admitted, {len(events.graduated)} graduated, {len(events.evicted)} evicted"
    )
    print(
        f"median {statistics.median(timings):.2f} ms | p90 {timings[int(0.9 * len(timings))]:.2f} ms | "
        f"max {timings[-1]:.2f} ms over {args.repeats} steps (target: median <= 20 ms)"
    )


if __name__ == "__main__":
    main()
