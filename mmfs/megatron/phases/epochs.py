"""Where a run in phases reads more of a dataset than its documents hold: for each
phase, each of its datasets' first sample past one epoch of its documents (and,
under continue, past its GPTDataset's end), named with the phase and the run's
iteration (mmfs/megatron/epochs.py says why by tokens).

Where a dataset stands in phase k is the mode's (docs/phases.md): under `restart`
each phase is Megatron-LM relaunched, its GPTDatasets built for the phase and read
from their sample 0, so each phase counts its own draws; under `continue` a dataset
goes on from where the earlier phases left it (the sum of their draws), so it passes
its documents once in the run, in the phase that draws the crossing sample.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mmfs.megatron.epoch_lines import MEGATRON_GOES_ON, Member, tokens_of, where

RESTART_SAYS = "Megatron-LM's relaunch for the phase " + MEGATRON_GOES_ON[len("Megatron "):]
CONTINUE_SAYS = ("Megatron-LM has no continue mode; mmfs's goes on in the dataset's GPTDataset (the further epochs "
                 "megatron-core built for the first phase naming it), and the model sees those documents again")
USED_UP_SAYS = ("Megatron-LM has no continue mode; mmfs's starts the dataset's next pass over at its GPTDataset's "
                "sample 0, in the same order (docs/phases.md)")


def phase_warnings(mode: str, starts: list[int], members: list[Member], phase_members: list[list[int]],
                   drawn: Callable[[int], np.ndarray], lengths: list[int] | None, schedule: Any,
                   cyclic: bool) -> list[str]:
    """The train lines of a run in phases. members[g]: the run's GPTDataset g (under
    restart the same dataset's Member in every phase it is in); phase_members[k]: the
    ids phase k draws from; drawn(k): the run's GPTDataset id of each of phase k's
    samples (samples starts[k] ...); lengths: each GPTDataset's samples (continue,
    once built: its next pass), or None."""
    out = []
    position = np.zeros(len(members), dtype=np.int64)  # continue: each dataset's draws before the phase
    crossed: dict[int, int] = {}  # continue: the phase where dataset g passed its documents
    for k, ids in enumerate(map(drawn, range(len(starts)))):
        counts = np.bincount(ids, minlength=len(members))
        before = position if mode == "continue" else np.zeros_like(position)
        for g in phase_members[k]:
            m, have = members[g], int(before[g])
            if counts[g] == 0:
                continue
            marks = []
            if lengths is None or m.one_epoch < lengths[g]:  # else its GPTDataset is the one epoch: used up there
                marks.append((m.one_epoch, "is read past its documents", f"its documents hold {m.one_epoch:,}",
                              RESTART_SAYS if mode == "restart" else CONTINUE_SAYS))
            if lengths is not None:
                one = " (one epoch of its documents)" if m.one_epoch >= lengths[g] else ""
                marks.append((lengths[g], "uses up its GPTDataset" + one, f"its GPTDataset holds {lengths[g]:,}",
                              USED_UP_SAYS))
            for mark, what, holds, says in marks:
                n = mark - have  # the phase's own draw of the dataset that reaches the mark
                if n >= counts[g] or (n < 0 and (what != "is read past its documents" or g not in crossed)):
                    continue
                since = ""
                if n < 0:  # continue: past them since an earlier phase, from its first draw here
                    since, n = f" (since phases[{crossed[g]}])", 0
                else:
                    crossed.setdefault(g, k)
                sample = starts[k] + int(np.flatnonzero(ids == g)[n])
                at = where("train", sample, schedule, False, False)
                order = (" (in the phase's order; its own cyclic sampler reads the phase shuffled)"
                         if cyclic else "")
                after = have + int(counts[g])
                out.append(f"train: phases[{k}]: {m.name} {what}{since} {at}{order}: by the phase's end the run "
                           f"has read {after:,} of its samples{'' if mode == 'continue' else ' in the phase'}, "
                           f"{holds} ({m.epochs(after):.2f} epochs). {says}")
        position += counts
    return out


def corpus_phase_warnings(corpus: Any, members: list[Member], schedule: Any, cyclic: bool) -> list[str]:
    """phase_warnings of a built run (its PhasedSplit's blend and GPTDatasets)."""
    split = corpus.indices["train"]
    index = split.blend.dataset_index
    lengths = [len(g) for g in split.gpts] if split.phases.mode == "continue" else None
    return phase_warnings(split.phases.mode, split.starts, members, [list(s.members) for s in split.slices],
                          lambda k: np.asarray(index[split.slices[k].start:split.slices[k].end], dtype=np.int64),
                          lengths, schedule, cyclic)


def planned_phase_warnings(config: Any, datasets: dict, schedule: Any, cyclic: bool) -> list[str]:
    """phase_warnings of a config before anything is built: each phase's draws are its
    own greedy blend over its weights (both modes draw so), one Member per dataset, and
    under continue its GPTDataset's length as megatron-core will build it."""
    from mmfs.megatron.build.builder import Builder
    from mmfs.megatron.indices.blend import build_blending_indices, sizes_per_dataset
    from mmfs.megatron.indices.gpt import plan_epochs, predict_gpt_size
    from mmfs.megatron.indices.splits import normalize, split_matrix, split_range
    from mmfs.megatron.phases.plan import megatron_weights

    phases = config.phases
    bookend = split_matrix(config.split)[0]
    if bookend is None:
        return []
    builder = Builder(config, datasets)
    files: dict[str, int] = {}
    members: list[Member] = []
    lengths: list[int] = []  # continue: each dataset's GPTDataset, sized for the first phase naming it
    phase_members = []
    for p in phases.phases:
        sizes = [phases.train_samples] if p.bare else \
            sizes_per_dataset(normalize(p.blend.weights), phases.train_samples, config.mid_level_dataset_surplus)
        for spec, size in zip(p.blend.datasets, sizes):
            if spec.file not in files:
                files[spec.file] = len(members)
                dataset = datasets[spec.file]
                beg, end = split_range(bookend, dataset.num_sequences)
                tokens = tokens_of(dataset, beg, end)
                members.append(Member(spec.name, tokens, config.sequence_length, int(config.add_extra_token)))
                params = builder.gpt_params(spec, "train", beg, end, size)
                lengths.append(predict_gpt_size(params, plan_epochs(params, tokens)).samples)
        phase_members.append([files[spec.file] for spec in p.blend.datasets])
    bounds = phases.bounds()

    def drawn(k: int) -> np.ndarray:
        p, (start, end) = phases.phases[k], bounds[k]
        local = np.zeros(end - start, dtype=np.int64) if p.bare or len(p.blend.datasets) == 1 else \
            np.asarray(build_blending_indices(megatron_weights(p.blend.weights), end - start)["dataset_index"])
        return np.asarray(phase_members[k], dtype=np.int64)[local]

    return phase_warnings(phases.mode, [s for s, _ in bounds], members, phase_members, drawn,
                          lengths if phases.mode == "continue" else None, schedule, cyclic)
