"""Build ZPPO-77K from Vero-600k and MMFineReason-SFT-586K (Hub ids or local snapshots).

    python recipes/build_corpus.py --processor Qwen/Qwen3.5-0.8B --output_dir data/zppo-77k

Writes ``OUTPUT_DIR/data/train-00000-of-00001.parquet``, ``report.json`` and ``report.txt``,
prints the provenance table, and with ``--push_to_hub REPO`` uploads the corpus. The recipe
and every choice it makes are documented in :mod:`zppo_trl.corpus`.
"""

from __future__ import annotations

import argparse
import dataclasses

from zppo_trl import corpus
from zppo_trl.processing import load_processor


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--processor", required=True, help="student checkpoint (Hub id or path) whose processor counts prompt tokens"
    )
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--vero", default=corpus.VERO.path, help="Vero-600k: Hub id or local snapshot directory")
    parser.add_argument(
        "--mmfinereason",
        default=corpus.MMFINEREASON.path,
        help="MMFineReason-SFT-586K: Hub id or local snapshot directory",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample under each cap")
    parser.add_argument("--tier1_cap", type=int, default=corpus.TIER_CAPS[1])
    parser.add_argument("--tier2_cap", type=int, default=corpus.TIER_CAPS[2])
    parser.add_argument("--batch_size", type=int, default=1024, help="rows per read batch")
    parser.add_argument("--push_to_hub", metavar="REPO", help="push the corpus to this Hub dataset repo")
    parser.add_argument("--private", action="store_true", help="with --push_to_hub: create a private repo")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def main(argv=None) -> corpus.CorpusReport:
    args = parse_args(argv)
    config = corpus.CorpusConfig(
        output_dir=args.output_dir,
        sources=[
            dataclasses.replace(corpus.VERO, path=args.vero),
            dataclasses.replace(corpus.MMFINEREASON, path=args.mmfinereason),
        ],
        seed=args.seed,
        tier_caps={1: args.tier1_cap, 2: args.tier2_cap},
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    report = corpus.build_corpus(config, load_processor(args.processor))
    print(report.format_table())
    print(f"corpus: {report.output}")
    if args.push_to_hub:
        corpus.push_corpus_to_hub(args.output_dir, args.push_to_hub, private=args.private)
    return report


if __name__ == "__main__":
    main()
