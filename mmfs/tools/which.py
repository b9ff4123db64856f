"""`mmfs which`: which samples each data-parallel rank read at a training iteration
(or in the global batch starting at a consumed_samples value), and where every token
of them came from (dataset, sequence, document, token range).

Iterations are numbered as Megatron logs them: iteration I (1-based) reads the
global batch [c, c + B) of the split's stream, where c and B follow the training:
block's batch-size schedule (constant: c = (I-1) * global_batch_size); that is
micro-batches c / (micro_batch_size * data_parallel_size) onwards of every rank,
B / (micro_batch_size * data_parallel_size) of them. The stream is the one of an
uninterrupted run from consumed_samples 0 (rankplan.stream_microbatch), so it runs
on into later epochs of a cyclic sampler.

For valid and test the iteration is an evaluation step, counted from 1 over all of
the run's evaluations (the valid iterator goes on from one evaluation to the
next): Megatron's evaluate() reads a constant eval global batch per step
(TrainingConfig.evaluation_batch_size), whatever the training schedule.

In a run in phases (config `phases:`, docs/phases.md) the answer names the phase
of the batch and of each train sample: the phase whose samples
[start_sample, end_sample) of the run hold it (or, for an id past the run's, the
restart phase whose own dataset holds it). Under the cyclic sampler each phase's
train iterations are read by its own sampler (sampling/phaseplan.py's
PhasedSampler). Under phase_mode restart each
relaunch evaluates on its own valid and test (megatron/phases/evals.py): an
evaluation step of valid is read by the launch that runs its evaluation, from
that phase's valid, by the loader the launch built at its consumed_valid_samples
(megatron/phases/evaluations.py); test is the last launch's, from 0. Each of its
micro-batches names its `stream_file`: the file of the phase's own streams/ folder
from= where that loader (or the pass of it that reads the step) starts, on the
config's layout.

--consumed C gives the global batch a job resumed at consumed_samples C reads (for
valid under restart: a job of the launch that evaluates there, resumed at
consumed_valid_samples C): C
onwards, of the size the calculator gives for C (which under a schedule may
differ from the size of the uninterrupted run's iteration around C), from
Megatron's sampler rebuilt at C (rankplan.resumed_microbatch: the same samples as
the uninterrupted run's except for an unsharded cyclic sampler after its first
epoch, whose ranks drift apart in an uninterrupted run; see rankplan's doc)."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from mmfs.errors import ConfigError, MmfsError
from mmfs.megatron import open_corpus
from mmfs.megatron.phases.evaluations import eval_schedule, launch_of, valid_launches
from mmfs.megatron.phases.sampling import sample_phase, split_sampler
from mmfs.megatron.sampling.rankplan import (
    microbatch_ids,
    plan_kind,
    plan_ranks,
    rank_ids,
    resumed_pass,
    stream_microbatch,
)
from mmfs.megatron.sampling.samplers import SamplerError
from mmfs.mount.contract import (
    MANIFEST,
    RANKS,
    file_name,
    name_width,
    phase_dir,
    phase_name_width,
    rank_dir,
    rank_name_width,
    stream_name,
    streams_dir,
)
from mmfs.mount.manifest import HYBRID_CP_WHY
from mmfs.storage import StorageError
from mmfs.storage.file import read_text_file
from mmfs.text.tokenizer import BYTE_EOD, BYTE_LEVEL, HUGGING_FACE, TokenizerSpec

# the plan kinds (which --json's "sampler") in words: Megatron's samplers are single and cyclic
SAMPLER_WORDS = {"single": "single", "sharded": "cyclic (sharded)", "unsharded": "cyclic (unsharded)"}
MAX_MANIFEST = 256 << 20  # a mount's mmfs.json: a few MB for the scale benchmark's 1,000-dataset blend


class WhichError(MmfsError):
    """`mmfs which` was asked about something the run never reads."""


def resolve_config(target: str) -> str:
    """The config behind a CONFIG or a MOUNT (its mmfs.json names the config)."""
    if os.path.isdir(target):
        info_path = os.path.join(target, MANIFEST)
        try:  # a regular file of bounded size, read without blocking: a FIFO there hung every reader
            info = json.loads(read_text_file(info_path, MAX_MANIFEST, "mmfs.json"))
        except StorageError as exc:  # (names the file)
            raise WhichError(f"{target}: not an mmfs mount or a config ({exc})") from None
        except (ValueError, RecursionError) as exc:
            raise WhichError(f"{target}: not an mmfs mount or a config ({info_path}: {exc})") from None
        config_path = info.get("config_path") if isinstance(info, dict) else None
        if not config_path or not isinstance(config_path, str):
            raise WhichError(f"{info_path}: has no config_path; give the YAML config instead")
        if not os.path.isfile(config_path):
            raise WhichError(f"{info_path}: its config_path {config_path} is not a file from here "
                             "(mounted from another folder?); give the YAML config instead")
        return config_path
    return target


def _document_of(dataset: Any, sequence: int) -> int:
    return int(np.searchsorted(dataset.document_indices, sequence, side="right")) - 1


def which(target: str, iteration: int | None, split: str = "train", rank: int | None = None,
          microbatch: int | None = None, decode=None, consumed: int | None = None) -> dict[str, Any]:
    """What `mmfs which` prints, as a dict. decode(tokens) -> str adds each piece's text.
    Give the iteration, or the consumed_samples at which a global batch starts."""
    config_path = resolve_config(target)
    return which_in(open_corpus(config_path, progress=False), iteration, split, rank, microbatch, decode, consumed)


def which_in(corpus, iteration: int | None, split: str = "train", rank: int | None = None,
             microbatch: int | None = None, decode=None, consumed: int | None = None) -> dict[str, Any]:
    """which() of an opened corpus (mmfs.megatron.Corpus)."""
    config_path = str(corpus.config_path)
    t = corpus.config.training
    if t is None:
        raise ConfigError(f"{config_path}: training: missing: mmfs which needs the block "
                          "(data_parallel_size, micro_batch_size, global_batch_size)")
    schedule = t.split_schedule(split)
    if schedule is None:
        raise ConfigError(f"{config_path}: training.global_batch_size: missing: an iteration reads one global "
                          "batch, so mmfs which needs its size (or a step_batch_size_schedule)")
    if split not in corpus.splits:
        raise WhichError(f"{config_path}: the {split} split has no samples (splits: {', '.join(corpus.splits)})")
    (kind, mbs), dp = t.layout(split), t.data_parallel_size  # evaluation may read on its own layout
    start, batch_size, iteration = _global_batch(schedule, iteration, consumed, mbs * dp)
    per_iteration = batch_size // (mbs * dp)
    ranks = range(dp) if rank is None else [rank]
    if rank is not None and not 0 <= rank < dp:
        raise WhichError(f"--rank {rank}: data_parallel_size is {dp}")
    micro = range(per_iteration) if microbatch is None else [microbatch]
    if microbatch is not None and not 0 <= microbatch < per_iteration:
        raise WhichError(f"--microbatch {microbatch}: an iteration has {per_iteration} micro-batches per rank")
    reader = corpus.splits[split]
    launch = _eval_launch(corpus, split, start, consumed is not None) if corpus.phase_splits and split != "train" \
        else None
    phase_width = 0
    if launch is not None:
        reader = corpus.phase_splits[launch["phase"]][split]
        phase_width = phase_name_width(len(corpus.phase_splits))
    # a run in phases under the cyclic sampler: each phase's own sampler (docs/phases.md)
    phased = split_sampler(reader.indices, kind, mbs, dp, t.data_sharding)
    plan = phased.plan(0, whole_pass=False) if phased is not None else \
        plan_ranks(len(reader), mbs, dp, kind, t.data_sharding, t.split_batch_size(split), t.batch_seed)
    datasets = {d.name: d.dataset for d in corpus.datasets}
    phases = corpus.config.phases if split == "train" else None
    out: dict[str, Any] = {
        "config": config_path, "split": split, "iteration": iteration,
        "consumed_samples": [start, start + batch_size], "global_batch_size": batch_size,
        "sampler": plan_kind(kind, t.data_sharding), "data_parallel_size": dp, "micro_batch_size": mbs,
        "microbatches_per_iteration": per_iteration,
        **({} if phases is None else {"phases": _phases_of(phases, start, start + batch_size)}),
        **({} if launch is None else {"phases": [launch]}),
        "ranks": [],
    }
    rerouted = split == "train" and t.hybrid_context_parallel
    if rerouted:  # the samplers' micro-batches; Megatron re-deals them between ranks (train/ranks/ not served)
        out["not_what_a_rank_trains_on"] = HYBRID_CP_WHY
    passes: dict = {}  # a resumed job's sampler passes, by consumed_samples
    # a restart launch's loader: the phase's own streams/ (docs/streams.md)
    folder = phase_dir(split, launch["phase"], phase_width).lstrip("/") if launch is not None else None
    for r in ranks:
        batches = []
        for k in micro:
            n = start // (mbs * dp) + k
            stream = None
            try:
                if launch is not None or (consumed is not None and phased is None):
                    # a loader built at a consumed_samples: the launch's (at its carried count), or a
                    # job resumed at C; Megatron's sampler rebuilt there, pass after pass
                    at = launch["loader_consumed_samples"] if launch is not None else start
                    found = resumed_pass(len(reader), mbs, dp, at, kind, t.data_sharding, r,
                                         (start - at) // (mbs * dp) + k, passes, t.split_batch_size(split),
                                         t.batch_seed)
                    if found is not None:
                        pass_plan, built_at, j = found
                        if launch is not None:  # (a --consumed answer stays the --iteration answer's twin)
                            stream = _stream_file(folder, r, built_at, j, pass_plan)
                        found = rank_ids(pass_plan, r, j, 1)[0], pass_plan.epoch
                elif phased is not None:  # the phase's own sampler (rebuilt at C for a resumed job)
                    found = phased.microbatch(r, n) if consumed is None else phased.resumed_microbatch(start, r, k)
                    found = found[:2]
                else:
                    found = stream_microbatch(plan, r, n) if plan.files_per_rank else None
            except SamplerError as exc:
                raise WhichError(f"{split}: {exc}") from None
            if found is None:
                raise WhichError(
                    f"{split}: consumed_samples {start} is past the end of the {split} split for the "
                    f"{SAMPLER_WORDS[out['sampler']]} sampler ({plan.files_per_rank} micro-batches per rank of "
                    f"{mbs * dp} samples in all); "
                    "Megatron's iterator has ended there"
                )
            ids, epoch = found
            batches.append({
                "microbatch": k, "stream_index": n, "epoch": epoch,
                "file": None if rerouted else _file(split, r, n, plan, ids, launch, phase_width),
                **({} if stream is None else {"stream_file": stream}),
                "samples": [_sample(reader, datasets, int(i), decode, phases, launch) for i in ids],
            })
        out["ranks"].append({"rank": r, "microbatches": batches})
    return out


def _file(split: str, rank: int, n: int, plan, ids, launch: dict | None, phase_width: int) -> str | None:
    """The rank file of the mount that holds micro-batch n of the stream (under a
    restart launch: of its phase's own split, when the file holds these very ids)."""
    if n >= plan.files_per_rank:
        return None
    width = name_width(plan.files_per_rank)
    if launch is None:
        return f"{rank_dir(split, rank, rank_name_width(plan.data_parallel_size)).lstrip('/')}/{file_name(n, width)}"
    if list(microbatch_ids(plan, rank, n)) != [int(i) for i in ids]:
        return None
    folder = phase_dir(split, launch["phase"], phase_width).lstrip("/")
    return f"{folder}/{RANKS}/{rank:0{rank_name_width(plan.data_parallel_size)}d}/{file_name(n, width)}"


def _stream_file(folder: str, rank: int, built_at: int, j: int, plan) -> str:
    """File j of `rank` in the stream folder of a sampler built at consumed_samples
    built_at on the config's layout: "valid/phases/001/streams/dp=2,mbs=2,from=32/000/0000003.bin"."""
    layout = stream_name(plan.data_parallel_size, plan.micro_batch_size, built_at)
    return (f"{streams_dir(folder).lstrip('/')}/{layout}/{rank:0{rank_name_width(plan.data_parallel_size)}d}/"
            f"{file_name(j, name_width(plan.files_per_rank))}")


def _eval_launch(corpus, split: str, start: int, resumed: bool) -> dict[str, Any]:
    """Under phase_mode restart: the launch that reads valid or test at consumed_samples
    `start`, its phase and where its loader starts (resumed: for valid, a job of that
    launch resumed at `start`; test's loader always starts at 0)."""
    phases = corpus.config.phases
    last = len(phases.phases) - 1
    info: dict[str, Any] = {}
    if split == "test":  # only the last launch evaluates test (the others exit at their transition first),
        k, at = last, 0  # its loader built at 0 (Megatron's, resumed or not)
    else:
        t = corpus.config.training
        schedule = eval_schedule(t, phases.train_samples)
        starts = [p.start_iteration for p in phases.phases]
        if schedule is None or None in starts:
            raise WhichError(f"{corpus.config_path}: training.eval_interval: missing: under phase_mode restart each "
                             "relaunch evaluates on its own valid split; give training.train_iters (or "
                             "train_samples) and eval_interval to say which launch runs each evaluation")
        evaluation = start // schedule.samples_per_evaluation if schedule.samples_per_evaluation else 0
        if evaluation >= schedule.count:
            raise WhichError(f"valid: consumed_samples {start} is past the run's {schedule.count} evaluations of "
                             f"{schedule.eval_iters} steps of {schedule.batch_size} samples")
        launch = launch_of(valid_launches(schedule, starts), evaluation)
        k, at = launch.phase, start if resumed else launch.loader_start
        info |= {"evaluation": evaluation + 1, "after_iteration": schedule.after_iteration(evaluation)}
    if split not in corpus.phase_splits[k]:
        raise WhichError(f"{corpus.config_path}: phases[{k}]: its {split} split has no samples")
    p = phases.phases[k]
    bounds = phases.bounds()[k]
    return {"phase": k, "start_iteration": p.start_iteration, "start_sample": bounds[0], "end_sample": bounds[1],
            "phase_mode": phases.mode, "datasets": {d.name: d.weight for d in p.blend.datasets},
            "loader_consumed_samples": at, **info}


def _global_batch(schedule, iteration: int | None, consumed: int | None,
                  step: int) -> tuple[int, int, int | None]:
    """(consumed_samples where the batch starts, its size, its iteration or None when
    `consumed` is not where an iteration of the schedule starts)."""
    if (iteration is None) == (consumed is None):
        raise WhichError("give --iteration or --consumed (one of them)")
    if consumed is None:
        if iteration < 1:
            raise WhichError(f"--iteration {iteration}: iterations count from 1, as Megatron logs them")
        return schedule.consumed_before(iteration), schedule.batch_size(iteration), iteration
    if consumed < 0 or consumed % step:
        raise WhichError(f"--consumed {consumed}: a global batch starts at a multiple of micro_batch_size x "
                         f"data_parallel_size = {step} on this layout")
    at, offset = schedule.iteration_at(consumed)
    return consumed, schedule.batch_size_at(consumed), at if offset == 0 else None


def _phases_of(phases, first: int, end: int) -> list[dict[str, Any]]:
    """The phases of the run's samples [first, end) (one, since phases start where a
    global batch of the run starts, unless a resumed job's batch crosses a start)."""
    hit = range(phases.phase_of(first), phases.phase_of(end - 1) + 1)
    bounds = phases.bounds()
    return [{"phase": k, "start_iteration": phases.phases[k].start_iteration,
             "start_sample": bounds[k][0], "end_sample": bounds[k][1], "phase_mode": phases.mode,
             "datasets": {d.name: d.weight for d in phases.phases[k].blend.datasets}} for k in hit]


def _sample(reader, datasets: dict, i: int, decode, phases=None, launch: dict | None = None) -> dict[str, Any]:
    name, pieces = reader.provenance(i)
    dataset = datasets[name]
    start = 0
    rows = []
    for seq, offset, length in pieces:
        row = {"sample_tokens": [start, start + length], "sequence": seq, "sequence_tokens": [offset, offset + length],
               "document": _document_of(dataset, seq)}
        if decode is not None:
            row["text"] = decode(dataset.get(seq, offset, length))
        rows.append(row)
        start += length
    out = {"sample": i, "dataset": name, "pieces": rows}
    if phases is not None:  # (an id past the run's samples: a restart phase's own, in beyond/)
        out["phase"] = sample_phase(reader.indices, i)
    elif launch is not None:  # a sample of that phase's own valid or test
        out["phase"] = launch["phase"]
    return out


# -- decoding --------------------------------------------------------------------------


def make_decoder(tokenizer_json: str | None, config_tokenizer: TokenizerSpec | None, vocab_size: int | None):
    """tokens -> text, with --tokenizer (a Hugging Face tokenizer.json or folder), else
    the config's `tokenizer.type`, else byte-level (token = byte, the demo's)."""
    if tokenizer_json:
        spec = TokenizerSpec(HUGGING_FACE, os.path.abspath(tokenizer_json))
    elif config_tokenizer is not None:
        spec = config_tokenizer
    elif vocab_size is None or vocab_size > BYTE_EOD + 1:
        raise MmfsError("--text: give --tokenizer tokenizer.json, or tokenizer.type (and its model) in the config "
                        "(byte-level decoding is only for vocabularies of at most 257 tokens, like the demo corpus)")
    else:
        spec = TokenizerSpec(BYTE_LEVEL)
    tokenizer = spec.load()
    return lambda tokens: tokenizer.decode(np.asarray(tokens).tolist())


# -- the command -----------------------------------------------------------------------


def _print_text(result: dict[str, Any]) -> None:
    lo, hi = result["consumed_samples"]
    iteration = "(no iteration of the schedule starts there)" if result["iteration"] is None \
        else f"iteration {result['iteration']}"
    print(f"{result['config']}: {result['split']} {iteration} "
          f"(consumed_samples {lo}..{hi}, global batch {hi - lo}), {SAMPLER_WORDS[result['sampler']]} sampler, "
          f"data_parallel_size "
          f"{result['data_parallel_size']}, micro_batch_size {result['micro_batch_size']}, "
          f"{result['microbatches_per_iteration']} micro-batch(es) per rank")
    for p in result.get("phases", ()):
        start = "" if p["start_iteration"] is None else f"from iteration {p['start_iteration'] + 1}, "
        weights = ", ".join(f"{name} {w:g}" for name, w in p["datasets"].items())
        print(f"phase {p['phase']} ({start}samples {p['start_sample']}..{p['end_sample']}, "
              f"{p['phase_mode']}): {weights}")
        if "loader_consumed_samples" in p:
            what = f"evaluation {p['evaluation']} (after iteration {p['after_iteration']}), " \
                if "evaluation" in p else ""
            print(f"  {what}read from phase {p['phase']}'s own {result['split']} split by its launch's loader, "
                  f"built at consumed_samples {p['loader_consumed_samples']}")
    if "not_what_a_rank_trains_on" in result:
        print(f"each rank's sampler reads the micro-batches below, not what the rank trains on: "
              f"{result['not_what_a_rank_trains_on']}")
    for r in result["ranks"]:
        for b in r["microbatches"]:
            where = f", epoch {b['epoch']}" if b["epoch"] else ""
            file = f", file {b['file']}" if b["file"] else ""
            print(f"rank {r['rank']} micro-batch {b['microbatch']} (the rank's micro-batch "
                  f"{b['stream_index']}{where}{file}):")
            if "stream_file" in b:  # what the loader built at that consumed_samples reads, on any mount
                print(f"  stream file {b['stream_file']}")
            for s in b["samples"]:
                phase = f"  phase {s['phase']}" if "phase" in s else ""
                print(f"  sample {s['sample']}  dataset {s['dataset']}{phase}")
                for p in s["pieces"]:
                    a, z = p["sample_tokens"]
                    so, sz = p["sequence_tokens"]
                    print(f"    tokens {a}..{z}  sequence {p['sequence']} tokens {so}..{sz}  document {p['document']}")
                    if "text" in p:
                        print("      " + json.dumps(p["text"], ensure_ascii=False))


def which_command(args) -> int:
    decode = None
    if args.text:
        config = resolve_config(args.target)
        from mmfs.config.schema import load_config

        cfg = load_config(config)
        vocab = cfg.tokenizer_identifiers.get("vocab_size")
        decode = make_decoder(args.tokenizer, cfg.tokenizer, None if vocab is None else int(vocab))
    result = which(args.target, args.iteration, args.split, args.rank, args.microbatch, decode,
                   consumed=args.consumed)
    if args.json:
        print(json.dumps(result, indent=1, ensure_ascii=False))
    else:
        _print_text(result)
    return 0
