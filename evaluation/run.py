#!/usr/bin/env python
"""Evaluate a served checkpoint on the paper's suite: ``zppo-eval run`` as a script.

    python evaluation/run.py --base-url http://127.0.0.1:8000/v1 --model outputs/zppo-0.8b \
        --judge-base-url http://127.0.0.1:8001/v1 --judge-model Qwen/Qwen3.5-27B-FP8 \
        --tasks all --output-dir evals/zppo-0.8b

See docs/evaluation.md; ``--help`` lists every option.
"""

import sys

from zppo_trl.evaluation.cli import run_main

if __name__ == "__main__":
    sys.exit(run_main())
