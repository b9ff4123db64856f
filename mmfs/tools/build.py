"""`mmfs build` and `mmfs sample`: the index math from the command line."""

from __future__ import annotations

import json
import sys

from mmfs.errors import ConfigError, FormatError, MmfsError, NativeError, first_few
from mmfs.megatron.build.check import check_sequences
from mmfs.megatron.corpus import open_corpus
from mmfs.megatron.epochs import corpus_warnings, say
from mmfs.megatron.indices.blend import blend_rounding
from mmfs.megatron.indices.gpt import gib
from mmfs.mount.manifest import epochs, manifest, top_level

MAX_PRINTED_TOKENS = 1 << 27  # 512 MiB of uint32; a bigger sample is read from a mount
PRINT_CHUNK = 1 << 16  # tokens turned into text at a time


def build_command(args) -> int:
    """Build (or load) every index of a config and print what it holds."""
    # Kept to the end: the collector need not walk its objects again (a tenth of a re-open).
    corpus = open_corpus(args.config, progress=not args.quiet, jobs=getattr(args, "jobs", None), freeze=True)
    say(corpus_warnings(corpus))
    if args.json:
        print(json.dumps(manifest(corpus), indent=2))
        return 0
    # The text summary needs no token counts (which read every dataset's lengths);
    # written at once: 20,000 lines printed one by one are a tenth of a re-open.
    lines = [f"{args.config}: {corpus.sample_tokens} {corpus.dtype.name} tokens per sample"]
    for name, indices in corpus.indices.items():
        lines.append(f"  {name}: {len(indices)} samples ({top_level(indices)}){rounding_note(corpus, name)}")
        lines.extend(f"    {g.spec.name}: sequences {g.params.beg}..{g.params.end}, {len(g)} samples, "
                     f"{epochs(g)} epoch(s)" for g in indices.gpts)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def rounding_note(corpus, split: str) -> str:
    """`; 1 more than the 16 asked: ...` when Megatron's blend rounds a split up."""
    asked = corpus.config.samples.get(split)
    indices = corpus.indices[split]
    if asked is None or indices.blend is None or indices.blend.weights is None:
        return ""
    per_dataset = blend_rounding(asked, indices.blend.weights)
    if per_dataset is None:
        return ""
    extra = sum(per_dataset) - asked
    return (f"; {extra:,} more than the {asked:,} asked ({corpus.config.samples_key(split)}): Megatron's blend "
            f"takes ceil({asked:,} × weight) of each dataset, {first_few([f'{n:,}' for n in per_dataset], ' + ')}")


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
    if reader.sample_tokens > MAX_PRINTED_TOKENS:
        raise ConfigError(f"{args.config}: sequence_length: a sample of {reader.sample_tokens:,} "
                          f"tokens ({gib(reader.sample_bytes)}) is too large to print as JSON "
                          f"(at most {MAX_PRINTED_TOKENS:,}); read it from a mount instead")
    try:
        name, pieces = reader.provenance(args.index)
        tokens = reader.tokens(args.index)
    except NativeError as exc:
        detail = unreadable_sample(reader, args.index) or str(exc)
        raise NativeError(f"{args.config}: {args.split} sample {args.index} cannot be read: "
                          f"{detail}") from None
    head = json.dumps({
        "split": args.split,
        "index": args.index,
        "dataset": name,
        "pieces": [{"sequence": s, "offset": o, "length": n} for s, o, n in pieces],
        "tokens": [],
    })
    # json.dumps's own layout, with the tokens written a chunk at a time
    out = sys.stdout
    out.write(head[: -len("[]}")] + "[")
    for start in range(0, tokens.size, PRINT_CHUNK):
        text = json.dumps(tokens[start : start + PRINT_CHUNK].tolist())[1:-1]
        out.write((", " if start else "") + text)
    out.write("]}\n")
    return 0


def unreadable_sample(reader, i: int) -> str | None:
    """Why sample i of a SplitReader cannot be read, naming the file, the sequence and
    the byte offset: the first sequence it spans that is not sound, or an index
    entry that points nowhere. None when every piece looks sound (the file changed
    while it was read, say)."""
    try:
        gpt, k = reader.locate(i)
    except MmfsError as exc:
        return str(exc)
    g, ds = gpt.gpt, gpt.source.dataset
    rows, docs = g.sample_index, g.document_index
    cache = g.cache.path("*") if g.cache.folder else "the indices in memory"
    if not 0 <= k < rows.shape[0] - 1:
        return f"unshuffled sample {k} is outside the sample index ({cache}); delete the cache"
    beg, end = int(rows[k, 0]), int(rows[k + 1, 0])
    if not 0 <= beg <= end < docs.shape[0]:
        return (f"sample_index rows {k}..{k + 1} span document_index entries {beg}..{end}, "
                f"outside [0, {docs.shape[0]}) ({cache}); delete the cache")
    for pos in range(beg, end + 1):
        seq = int(docs[pos])
        if not 0 <= seq < ds.num_sequences:
            return (f"document_index[{pos}] names sequence {seq}, but {ds.idx_path} has "
                    f"{ds.num_sequences} ({cache}); delete the cache")
        try:
            check_sequences(ds, seq, seq + 1)
        except FormatError as exc:
            return f"{gpt.name} (unshuffled sample {k}) reads {exc}"
    return None
