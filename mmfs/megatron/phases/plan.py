"""A run in phases: the train split's blend changes at phase boundaries
(docs/phases.md). Index math only: no config parsing, no FUSE.

The whole run is one blend over the run's GPTDatasets, in the two arrays a
BlendedDataset has (so every reader of a split, the C core's included, serves it
unchanged):

    dataset_index         int16[samples.train]   which of the run's GPTDatasets serves train sample i
    dataset_sample_index  int64[samples.train]   which sample of that GPTDataset

phase_mode `continue` (the default): one GPTDataset per dataset, the one
megatron-core builds for the first phase that names the dataset, sized with the
run's train sample count (Megatron's ceil(ceil(samples.train × w) × (1 +
surplus))). Within phase k (samples [s_k, s_{k+1})) the dataset of each sample is
Megatron's greedy blending index on that phase's weights, counted from the
phase's start (build_blending_indices(w_k, s_{k+1} - s_k)). A dataset's position
when phase k starts is the sum of its draws in the phases before k (closed form:
a column sum of the draws table), so sample j of the dataset within phase k is
GPTDataset sample (position_k + j) mod len(GPTDataset): no (dataset, sample) pair
is served twice until the dataset's GPTDataset is used up, after which it starts
over from its first sample (its next pass; counted as repeats).

phase_mode `restart`: Megatron-LM's --phase-transition-iterations. Phase k is the
BlendedDataset megatron-core builds from that phase's arguments alone, sized to
the phase (s_{k+1} - s_k train samples), read from its sample 0; the run's
GPTDatasets are every phase's own.

Either way phase 0 is stock Megatron: its samples are the first s_1 samples of
the BlendedDataset megatron-core builds for phase 0's arguments (with
samples.train under continue, with s_1 under restart). Nothing of phase k
depends on a phase after it (append-only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mmfs.megatron.indices.blend import build_blending_indices
from mmfs.megatron.indices.splits import normalize


def megatron_weights(weights: list[float]) -> list[float]:
    """A blend's weights as its BlendedDataset holds them: normalised by the
    dataset builder, then again by BlendedDataset (the same doubles)."""
    return normalize(normalize(weights))


@dataclass(frozen=True)
class PhaseSlice:
    """One phase as the run's blend sees it.

    start, end: its train samples [start, end);
    members: the run's GPTDataset ids its blend draws from, in the phase's order;
    weights: their weights as Megatron holds them (megatron_weights)."""

    start: int
    end: int
    members: tuple[int, ...]
    weights: tuple[float, ...]

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass
class PhasedBlend:
    """The run's blend and what each phase drew.

    dataset_index, dataset_sample_index: the run's two blend arrays (above);
    draws: int64[phases, GPTDatasets], the samples each phase drew from each;
    positions: int64[phases + 1, GPTDatasets], where each dataset stands when each
    phase starts (row k = column sums of draws[:k]; the last row: the run's end)."""

    dataset_index: np.ndarray
    dataset_sample_index: np.ndarray
    draws: np.ndarray
    positions: np.ndarray


def draws_and_positions(dataset_index: np.ndarray, slices: list[PhaseSlice], num_gpts: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The draws table of a run's dataset_index and its cumulative positions."""
    draws = np.zeros((len(slices), num_gpts), dtype=np.int64)
    for k, s in enumerate(slices):
        draws[k] = np.bincount(dataset_index[s.start:s.end], minlength=num_gpts)
    positions = np.zeros((len(slices) + 1, num_gpts), dtype=np.int64)
    np.cumsum(draws, axis=0, out=positions[1:])
    return draws, positions


def continue_blend(slices: list[PhaseSlice], num_gpts: int) -> PhasedBlend:
    """phase_mode continue, before any wrap: dataset_sample_index holds each
    dataset's position (which may run past its GPTDataset's length: see wrap)."""
    total = slices[-1].end
    dataset_index = np.empty(total, dtype=np.int16)
    dataset_sample_index = np.empty(total, dtype=np.int64)
    position = np.zeros(num_gpts, dtype=np.int64)
    for s in slices:
        local = build_blending_indices(list(s.weights), s.size)
        members = np.asarray(s.members, dtype=np.int16)
        ids = members[local["dataset_index"]]
        dataset_index[s.start:s.end] = ids
        dataset_sample_index[s.start:s.end] = position[ids] + local["dataset_sample_index"]
        position += np.bincount(ids, minlength=num_gpts)
    draws, positions = draws_and_positions(dataset_index, slices, num_gpts)
    return PhasedBlend(dataset_index, dataset_sample_index, draws, positions)


def used_up(positions: np.ndarray, lengths: list[int]) -> bool:
    """Whether some dataset runs past its GPTDataset by the end of the run."""
    return bool((positions[-1] > np.asarray(lengths, dtype=np.int64)).any())


def wrap(dataset_index: np.ndarray, dataset_sample_index: np.ndarray, lengths: list[int]) -> np.ndarray:
    """Positions as GPTDataset samples: a used-up dataset's next pass starts over
    at its sample 0 (position mod its length)."""
    lengths_array = np.asarray(lengths, dtype=np.int64)
    return np.remainder(dataset_sample_index, lengths_array[np.asarray(dataset_index)])


def restart_blend(slices: list[PhaseSlice], phase_blends: list[dict], num_gpts: int) -> PhasedBlend:
    """phase_mode restart: phase_blends[k] is phase k's own BlendedDataset arrays
    (dataset ids local to the phase: slices[k].members maps them to the run's)."""
    total = slices[-1].end
    dataset_index = np.empty(total, dtype=np.int16)
    dataset_sample_index = np.empty(total, dtype=np.int64)
    for s, arrays in zip(slices, phase_blends):
        members = np.asarray(s.members, dtype=np.int16)
        dataset_index[s.start:s.end] = members[np.asarray(arrays["dataset_index"][:s.size])]
        dataset_sample_index[s.start:s.end] = arrays["dataset_sample_index"][:s.size]
    draws, positions = draws_and_positions(dataset_index, slices, num_gpts)
    return PhasedBlend(dataset_index, dataset_sample_index, draws, positions)


def phase_of(starts: list[int], sample: int) -> int:
    """The phase of train sample `sample`, given each phase's first sample."""
    return int(np.searchsorted(np.asarray(starts), sample, side="right")) - 1


__all__ = ["PhaseSlice", "PhasedBlend", "continue_blend", "restart_blend", "draws_and_positions",
           "megatron_weights", "phase_of", "used_up", "wrap"]
