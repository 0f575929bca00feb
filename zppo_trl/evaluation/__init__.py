"""The paper's evaluation harness as a library.

`zppo_trl.evaluation.tasks` holds the 31-setting suite and the shared decoding configuration
as data; `zppo_trl.evaluation.scorers` the deterministic scoring paths (Exact, each
benchmark's own Rule, Det.) and the official aggregations; `zppo_trl.evaluation.judges` the
five benchmark judges (BenchJudge) with their strict reply parsers; `zppo_trl.evaluation.stats` the
macro averages and the paired setting-bootstrap.
The user-facing scripts under `evaluation/` only wire these together.
"""
