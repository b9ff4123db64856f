"""`mmfs report`: a blend as it will be trained on, in figures (per split, train
first): each dataset's weight against its realised share, draws, tokens, documents
and epochs; the mix per window of iterations with the batch-size steps as bands;
document lengths and how samples cut them; the shares each data-parallel rank gets;
a bounded set of iterations' samples for the page's browser; and warnings, each
with the numbers behind it. Aggregates only (no list of every sample): a blend of
a thousand datasets and millions of samples stays a few hundred KB of figures.
The counts come from mmfs.megatron (mix, rankplan); the page is page.py."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from mmfs import __version__
from mmfs.config.schema import SPLITS
from mmfs.errors import MmfsError
from mmfs.megatron import open_corpus
from mmfs.megatron.indices.blend import blend_rounding
from mmfs.megatron.indices.mix import dataset_of, epochs_in_index, gpt_samples, sample_cuts, sequence_lengths
from mmfs.megatron.indices.splits import normalize
from mmfs.megatron.phases.sampling import split_sampler
from mmfs.megatron.sampling.rankplan import plan_ranks, rank_of_position, stream_order
from mmfs.tools.report.phases import (
    dataset_groups,
    is_phased,
    merge_rows,
    phase_bands,
    phase_figures,
    phase_split_figures,
    run_weights,
)
from mmfs.tools.report.warnings import blend_warnings
from mmfs.tools.report.words import plural

MAX_WINDOWS = 100  # points of the mix chart
MAX_RANK_CELLS = 1 << 21  # ranks x datasets of the per-rank shares (larger: each dataset's spread only)
BROWSER_SAMPLES = 2000  # samples the page's browser holds at most (whole iterations, at least one)
BROWSER_ITERATIONS = 24
NOTE_DATASETS = 8  # named with their counts in the rounding note
PRINTED_WARNINGS = 10  # by the command; the page and --json have them all
TEXT_CHARS = 2000  # of each piece's decoded text in the browser
# Document length bins: powers of two in half steps, 1 .. 2**31.
LENGTH_EDGES = np.unique(np.round(2.0 ** (np.arange(0, 63) / 2)).astype(np.int64))


def report(target: str, iterations: list[int] | None = None, browser: bool = True) -> dict[str, Any]:
    """The figures of a CONFIG or a MOUNT (its mmfs.json names the config)."""
    from mmfs.tools.which import resolve_config

    return figures(open_corpus(resolve_config(target), progress=False), iterations, browser)


def figures(corpus, iterations: list[int] | None = None, browser: bool = True) -> dict[str, Any]:
    """The figures of an opened corpus (mmfs.megatron.Corpus). browser: add the
    samples of a bounded set of iterations (or of `iterations`) with their text."""
    lengths = {e.name: sequence_lengths(e.dataset) for e in corpus.datasets}
    splits = {name: _split(corpus, name, corpus.indices[name], lengths)
              for name in SPLITS if name in corpus.indices and len(corpus.indices[name]) > 0}
    # under restart: each phase's own valid and test, as its relaunch builds them
    for name, own in phase_split_figures(corpus, lambda n, s: _split(corpus, n, s, lengths)).items():
        if name in splits:
            splits[name]["by_phase"] = own
    out: dict[str, Any] = {
        "mmfs_version": __version__,
        "config": os.path.abspath(str(corpus.config_path)),
        "sequence_length": int(corpus.sequence_length),
        "tokens_per_sample": int(corpus.sample_tokens),
        "training": None if corpus.config.training is None else corpus.config.training.as_dict(),
        "datasets": [_dataset(e, lengths[e.name]) for e in corpus.datasets],
        "splits": splits,
        "warnings": blend_warnings(corpus, splits),
    }
    if browser:
        out["browser"] = sample_browser(corpus, splits.get("train"), iterations)
    return out


def _dataset(entry, lengths: np.ndarray) -> dict[str, Any]:
    ds = entry.dataset
    return {"name": entry.name, "path": entry.path, "format": ds.format_name,
            "sequences": int(ds.num_sequences), "documents": int(ds.num_documents), "tokens": int(lengths.sum())}


# -- one split ---------------------------------------------------------------------------


def _run(corpus, name: str, indices) -> tuple[Any, np.ndarray, dict[str, Any]]:
    """(the rank plan or None, the sample ids in the order the run reads them, the run's
    extent): the train split by iterations of the batch-size schedule, the others (and
    a config without a training: block) by samples."""
    t = corpus.config.training
    total = len(indices)
    kind, mbs = ("single", 1) if t is None else t.layout(name)  # the split's own sampler
    phased = None if t is None else split_sampler(indices, kind, mbs, t.data_parallel_size, t.data_sharding)
    plan = phased.plan(0, whole_pass=False) if phased is not None else \
        None if t is None else plan_ranks(total, mbs, t.data_parallel_size, kind, t.data_sharding,
                                          t.split_batch_size(name), t.batch_seed)
    order = np.arange(total, dtype=np.int64) if plan is None else stream_order(plan)
    run: dict[str, Any] = {"axis": "sample", "samples": len(order), "iterations": None, "notes": []}
    if plan is not None and len(order) < total:
        left = total - len(order)
        run["notes"].append(f"{plural(left, 'sample')} at the end of the split {'makes' if left == 1 else 'make'} "
                            f"no whole micro-batch of every rank and {'is' if left == 1 else 'are'} never read")
    schedule = None if t is None else t.schedule
    if name == "train" and schedule is not None:
        done = schedule.iteration_at(len(order))[0] - 1  # whole iterations in one pass of the sampler
        iters = done if t.train_iters is None else min(t.train_iters, done)
        if t.train_iters is not None and t.train_iters > done:
            run["notes"].append(f"training.train_iters {t.train_iters}: one pass of the split holds {done} "
                                "iterations; the figures cover those")
        if iters > 0:
            run.update(axis="iteration", iterations=iters, samples=schedule.consumed_before(iters + 1))
    return plan, order[:run["samples"]], run


def _windows(run: dict[str, Any], schedule) -> tuple[list[dict[str, int]], list[dict[str, Any]]]:
    """Windows of the run (by iteration or by sample) and the bands marked on the mix:
    the segments of the batch-size schedule (a training phase would be one more kind)."""
    if run["axis"] == "iteration":
        its = np.unique(np.linspace(1, run["iterations"] + 1, min(run["iterations"], MAX_WINDOWS) + 1).astype(int))
        starts = [schedule.consumed_before(int(i)) for i in its]
        windows = [{"first_iteration": int(a), "last_iteration": int(b) - 1, "first_sample": s, "end_sample": e}
                   for a, b, s, e in zip(its, its[1:], starts, starts[1:])]
        bands = []
        segments = list(zip(schedule.first_iterations, schedule.batch_sizes))
        for k, (first, size) in enumerate(segments):
            last = segments[k + 1][0] - 1 if k + 1 < len(segments) else run["iterations"]
            if first <= run["iterations"]:
                bands.append({"kind": "batch_size", "first_iteration": int(first),
                              "last_iteration": int(min(last, run["iterations"])),
                              "label": f"global batch {size}"})
        return windows, bands
    edges = np.unique(np.linspace(0, run["samples"], min(run["samples"], MAX_WINDOWS) + 1).astype(np.int64))
    return [{"first_sample": int(a), "end_sample": int(b)} for a, b in zip(edges, edges[1:])], []


def _split(corpus, name: str, indices, lengths: dict[str, np.ndarray]) -> dict[str, Any]:
    t = corpus.config.training
    schedule = None if t is None else t.schedule
    plan, ids, run = _run(corpus, name, indices)
    gpts = indices.gpts
    which = dataset_of(indices, ids)
    windows, bands = _windows(run, schedule)
    phased = is_phased(indices)
    groups = dataset_groups(gpts) if phased else np.arange(len(gpts))
    which = groups[which]  # a row per dataset: a phased run's GPTDatasets of one dataset as one
    datasets = int(groups.max()) + 1
    mix = [np.bincount(which[w["first_sample"]:w["end_sample"]], minlength=datasets).tolist() for w in windows]
    drawn = np.bincount(which, minlength=datasets)
    if phased:
        weights = run_weights(indices, groups, len(ids))
    else:
        weights = [1.0] if indices.blend is None else normalize([float(w) for w in indices.blend.weights])
    rows = []
    for g, samples in zip(gpts, gpt_samples(indices, ids)):
        rows.append(_gpt_row(corpus, g, samples, len(ids), lengths[g.spec.name]))
    rows = merge_rows(rows, groups, len(ids)) if phased else rows
    for row, w in zip(rows, weights):
        row["weight"] = w
    out: dict[str, Any] = {
        "samples": len(indices),
        "top_level": "phases" if phased else "BlendedDataset" if indices.blend is not None else "GPTDataset",
        "run": run,
        "datasets": rows,
        "mix": {"windows": windows, "counts": mix, "bands": bands},
        "ranks": None if plan is None else _ranks(plan, which, datasets, drawn),
    }
    rounding = _rounding(corpus, name, indices) if not phased else None
    if rounding is not None:
        out["rounding"] = rounding
    if phased:
        out["phases"] = phase_figures(indices, corpus.splits[name], groups, schedule, t)
        bands += phase_bands(out["phases"], run)
    return out


def _rounding(corpus, name: str, indices) -> dict[str, Any] | None:
    """When a blended split holds more samples than asked: the numbers (as `mmfs build`
    says them, from megatron/indices/blend.py's blend_rounding) and a sentence."""
    asked = corpus.config.samples.get(name)
    if asked is None or indices.blend is None or indices.blend.weights is None:
        return None
    per_dataset = blend_rounding(asked, indices.blend.weights)
    if per_dataset is None or sum(per_dataset) != len(indices):  # (a relaunch's own split is asked for other counts)
        return None
    total = sum(per_dataset)
    each = ", ".join(f"{g.spec.name} {n:,}" for g, n in zip(indices.gpts[:NOTE_DATASETS], per_dataset))
    if len(per_dataset) > NOTE_DATASETS:  # (every dataset's count is in per_dataset)
        each += f", and {len(per_dataset) - NOTE_DATASETS:,} more datasets"
    return {"asked": asked, "samples": total, "per_dataset": per_dataset,
            "note": f"{name}: {total:,} samples, {total - asked:,} more than the {asked:,} asked "
                    f"({corpus.config.samples_key(name)}): Megatron's blend gives each dataset "
                    f"ceil({asked:,} x its weight) samples ({each})"}


def _gpt_row(corpus, g, samples: np.ndarray, run_samples: int, lengths: np.ndarray) -> dict[str, Any]:
    beg, end = g.params.beg, g.params.end
    own = lengths[beg:end]
    available = int(own.sum())
    cuts = sample_cuts(g, samples, lengths)
    read = len(samples)
    tokens = read * int(corpus.sequence_length)
    return {
        "dataset": g.spec.name,
        "path": g.spec.path,
        "weight": None,  # the split's (_split)
        "share": read / run_samples if run_samples else 0.0,
        "samples": read,
        "samples_built": len(g),  # the GPTDataset's size (Megatron's, with the blend's surplus)
        "tokens": tokens,
        "sequences": [beg, end],
        "documents": end - beg,
        "tokens_available": available,
        "epochs": tokens / available if available else 0.0,
        "epochs_in_index": epochs_in_index(g),
        "epochs_reached": cuts.epochs_reached,
        "samples_per_epoch": cuts.read_per_epoch.tolist(),
        "documents_per_sample": cuts.documents_per_sample.tolist(),
        "mid_document": cuts.mid_document,
        "mid_document_share": cuts.mid_document / read if read else 0.0,
        "lengths": _lengths(own),
    }


def _lengths(own: np.ndarray) -> dict[str, Any]:
    """The distribution of a split's document lengths (in tokens)."""
    if own.size == 0:
        return {"histogram": [], "edges": [], "min": 0, "median": 0, "mean": 0.0, "p90": 0, "max": 0}
    top = int(np.searchsorted(LENGTH_EDGES, int(own.max()), side="right"))
    edges = LENGTH_EDGES[:top + 1]
    counts = np.bincount(np.searchsorted(edges, own, side="right") - 1, minlength=len(edges))[:len(edges)]
    return {"edges": edges.tolist(), "histogram": counts.tolist(), "min": int(own.min()),
            "median": float(np.median(own)), "mean": float(own.mean()), "p90": float(np.percentile(own, 90)),
            "max": int(own.max())}


def _ranks(plan, which: np.ndarray, datasets: int, drawn: np.ndarray) -> dict[str, Any]:
    """The share of each dataset in what each data-parallel rank reads of the run."""
    dp = plan.data_parallel_size
    out: dict[str, Any] = {"data_parallel_size": dp, "sampler": plan.kind if plan.kind != "phased" else
                           "sharded" if plan.phases and plan.phases[0].plan.kind == "sharded" else "unsharded"}
    if dp * datasets > MAX_RANK_CELLS:
        out["note"] = f"{dp} ranks x {datasets} datasets: only each dataset's spread over the ranks is kept"
        return out | _spread_by_chunks(plan, which, datasets, drawn)
    rank = rank_of_position(np.arange(len(which), dtype=np.int64), plan.micro_batch_size, dp)
    counts = np.bincount(rank * datasets + which, minlength=dp * datasets).reshape(dp, datasets)
    per_rank = counts.sum(axis=1)
    out["samples"] = per_rank.tolist()
    out["counts"] = counts.tolist() if dp * datasets <= 65536 else None
    return out | _spread(counts, per_rank, drawn)


def _spread(counts: np.ndarray, per_rank: np.ndarray, drawn: np.ndarray) -> dict[str, Any]:
    shares = counts / np.maximum(per_rank, 1)[:, None]
    overall = drawn / max(int(drawn.sum()), 1)
    deviation = np.abs(shares - overall[None, :])
    return {"share_min": shares.min(axis=0).tolist(), "share_max": shares.max(axis=0).tolist(),
            "max_deviation": float(deviation.max()) if deviation.size else 0.0}


def _spread_by_chunks(plan, which: np.ndarray, datasets: int, drawn: np.ndarray) -> dict[str, Any]:
    dp, mbs = plan.data_parallel_size, plan.micro_batch_size
    step = max(1, MAX_RANK_CELLS // datasets)
    low, high, worst = np.ones(datasets), np.zeros(datasets), 0.0
    positions = np.arange(len(which), dtype=np.int64)
    rank = rank_of_position(positions, mbs, dp)
    for r0 in range(0, dp, step):
        mine = (rank >= r0) & (rank < r0 + step)
        counts = np.bincount((rank[mine] - r0) * datasets + which[mine], minlength=step * datasets)
        counts = counts.reshape(step, datasets)[:min(step, dp - r0)]
        s = _spread(counts, counts.sum(axis=1), drawn)
        low, high = np.minimum(low, s["share_min"]), np.maximum(high, s["share_max"])
        worst = max(worst, s["max_deviation"])
    return {"share_min": low.tolist(), "share_max": high.tolist(), "max_deviation": worst}


# -- the sample browser --------------------------------------------------------------------


def browser_iterations(train: dict[str, Any] | None, batch_size: int) -> list[int]:
    """A bounded set of iterations spread over the run (the first and the last among them)."""
    if train is None or train["run"]["axis"] != "iteration":
        return []
    last = train["run"]["iterations"]
    count = max(1, min(BROWSER_ITERATIONS, BROWSER_SAMPLES // max(batch_size, 1), last))
    return sorted({int(i) for i in np.linspace(1, last, count).round()})


def sample_browser(corpus, train: dict[str, Any] | None, iterations: list[int] | None) -> dict[str, Any]:
    """Each rank's samples, with provenance and text, at a bounded set of iterations
    (what `mmfs which --text` says of them)."""
    from mmfs.tools.which import which_in

    t = corpus.config.training
    if train is None or t is None or t.schedule is None:
        return {"iterations": [], "note": "the browser needs a training: block with a global batch size"}
    chosen = iterations or browser_iterations(train, max(t.schedule.batch_sizes))
    decode, note = _decoder(corpus)
    out = []
    for i in chosen:
        found = which_in(corpus, i, "train", decode=decode)
        for r in found["ranks"]:
            for b in r["microbatches"]:
                for s in b["samples"]:
                    for p in s["pieces"]:
                        if len(p.get("text", "")) > TEXT_CHARS:
                            p["text"] = p["text"][:TEXT_CHARS]
                            p["text_cut"] = True
        out.append({"iteration": i, "consumed_samples": found["consumed_samples"], "ranks": found["ranks"],
                    **({"phases": [p["phase"] for p in found["phases"]]} if "phases" in found else {})})
    return {"iterations": out, "text": decode is not None, "text_chars": TEXT_CHARS, "note": note}


def _decoder(corpus):
    """(tokens -> text, or None, and why not) from the config's tokenizer."""
    from mmfs.tools.which import make_decoder

    vocab = corpus.config.tokenizer_identifiers.get("vocab_size")
    try:
        return make_decoder(None, corpus.config.tokenizer, None if vocab is None else int(vocab)), None
    except (MmfsError, ImportError) as exc:
        return None, f"no text: {exc}"


# -- the command ---------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def to_json(figs: dict[str, Any]) -> str:
    return json.dumps(figs, default=_json_default, ensure_ascii=False)


def report_command(args) -> int:
    iterations = args.iterations or None  # (cli parses I,J,...)
    if args.json:
        figs = report(args.target, iterations, browser=iterations is not None)
        print(json.dumps(figs, default=_json_default, separators=(",", ":"), ensure_ascii=False))
        return 0
    from mmfs.tools.report.page import check_output, write_page

    path = "report.html" if args.output is None else args.output
    check_output(path)  # before the figures: a wrong -o is told at once
    figs = report(args.target, iterations)
    size = write_page(figs, path)
    print(f"{path}: {size:,} bytes; open it in a browser (no network or server needed)")
    shown = figs["warnings"][:PRINTED_WARNINGS]
    for w in shown:
        print(f"warning: {w['message']}")
    if len(figs["warnings"]) > len(shown):
        print(f"warning: ... and {len(figs['warnings']) - len(shown)} more (the page lists them all)")
    return 0

