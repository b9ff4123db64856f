"""`mmfs build` and `mmfs sample`: the index math from the command line."""

from __future__ import annotations

import json

from ..errors import ConfigError
from .corpus import open_corpus


def build_command(args) -> int:
    """Build (or load) every index of a config and print what it holds."""
    corpus = open_corpus(args.config, progress=not args.quiet, jobs=getattr(args, "jobs", None))
    summary = corpus.describe()
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{args.config}: {summary['tokens_per_sample']} {summary['dtype']} tokens per sample")
    for name, split in summary["splits"].items():
        print(f"  {name}: {split['samples']} samples ({split['top_level']})")
        for g in split["gpt_datasets"]:
            print(f"    {g['dataset']}: sequences {g['sequences'][0]}..{g['sequences'][1]}, "
                  f"{g['samples']} samples, {g['epochs']} epoch(s)")
    return 0


def sample_command(args) -> int:
    """Print one sample's tokens and where they come from."""
    corpus = open_corpus(args.config, progress=False)
    if args.split not in corpus.splits:
        raise ConfigError(f"{args.config}: the {args.split} split has no samples "
                          f"(splits: {', '.join(corpus.splits) or 'none'})")
    reader = corpus.splits[args.split]
    if not 0 <= args.index < len(reader):
        raise ConfigError(f"{args.config}: {args.split} has {len(reader)} samples; "
                          f"{args.index} is out of range")
    name, pieces = reader.provenance(args.index)
    print(json.dumps({
        "split": args.split,
        "index": args.index,
        "dataset": name,
        "pieces": [{"sequence": s, "offset": o, "length": n} for s, o, n in pieces],
        "tokens": reader.tokens(args.index).tolist(),
    }))
    return 0
