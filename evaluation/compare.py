#!/usr/bin/env python
"""Compare evaluation runs in the paper's table layout: ``zppo-eval compare`` as a script.

    python evaluation/compare.py evals/grpo-0.8b evals/zppo-0.8b --bootstrap --plot families.png

See docs/evaluation.md; ``--help`` lists every option.
"""

import sys

from zppo_trl.evaluation.report import compare_main

if __name__ == "__main__":
    sys.exit(compare_main())
