"""What Megatron reads in each cell of the reference matrix (tests/reference/matrix.json,
recorded by tests/reference/record_matrix.py), as the sample digests every view of a
mount must show, and the counting of what a view shows wrong (tests/test_matrix.py).

A sample is known by its digest (sha256 of its sequence_length + 1 tokens as int64,
first 12 hex digits), a micro-batch by the list of its samples' digests: a view is
right when it shows the same lists in the same places, whatever ids it gives them.
Where Megatron does not define the answer (continue after its first phase: mmfs's own
mode) the expected samples follow docs/phases.md's continue rule over the GPTDatasets
megatron-core built, and the cyclic sampler's stream is checked by its properties.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

import matrix_cases as mc

REFERENCE = json.loads((Path(__file__).resolve().parent / "reference" / "matrix.json").read_text())
DATASETS: dict[str, list[str]] = REFERENCE["datasets"]
CELLS: dict[str, dict] = REFERENCE["cells"]
DIGITS = 12


def digest(tokens: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:DIGITS]


def file_digests(data: bytes, dtype: np.dtype, tokens_per_sample: int) -> list[str]:
    """The digests of the samples a file of samples (a sample or micro-batch file) holds."""
    tokens = np.frombuffer(data, dtype=dtype).reshape(-1, tokens_per_sample)
    return [digest(row) for row in tokens]


def wrong(got: list, want: list) -> list[int]:
    """The positions where a view's micro-batches (or samples) differ from the reference,
    those it lacks included."""
    return [k for k in range(max(len(got), len(want))) if k >= len(got) or k >= len(want) or got[k] != want[k]]


def describe(view: str, got: list, want: list) -> str:
    bad = wrong(got, want)
    if not bad:
        return ""
    k = bad[0]
    return (f"{view}: {len(bad)} of {len(want)} wrong (first at {k}: got {got[k] if k < len(got) else 'nothing'}, "
            f"Megatron read {want[k] if k < len(want) else 'nothing'})")


class Cell:
    """One recorded cell: (sampler, mode, schedule)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sampler, self.mode, self.schedule = name.split("/")
        self.ref = CELLS[name]
        self.base = CELLS[self.ref.get("stock", name)]  # continue: Megatron's stock run of its first phase
        self.consumed: list[int] = self.ref["consumed_before_iteration"]
        self.train_iters: int = self.ref["train_iters"]
        self.starts: list[int] = self.ref["phase_starts"] if self.mode != "none" else []
        self.bounds = [0, *self.starts, mc.TRAIN_SAMPLES]
        self.group = mc.DATA_PARALLEL_SIZE * mc.MICRO_BATCH_SIZE
        self.cyclic = mc.SAMPLERS[self.sampler][0] == "cyclic"
        # Megatron defines every train micro-batch, except continue x cyclic (mmfs's own order)
        self.exact_stream = not (self.mode == "continue" and self.cyclic)
        self._samples: list[str] | None = None

    def phase_of(self, sample: int) -> int:
        return sum(sample >= s for s in self.starts)

    def phase_of_iteration(self, iteration: int) -> int:
        """The phase of 1-based iteration I (a phase starts where a global batch starts)."""
        return self.phase_of(self.consumed[iteration - 1])

    # -- samples/ -------------------------------------------------------------------

    def train_samples(self) -> list[str]:
        """train/samples/: Megatron's train split (restart: each launch's phase-sized dataset from
        its sample 0); continue: its first phase Megatron's, every sample by the continue rule."""
        if self._samples is None:
            if self.mode == "continue":
                self._samples = continue_rule(self.bounds, self.ref["continue_gpt"])
                stock = DATASETS[self.base["launches"][0]["train"]]
                assert self._samples[:self.starts[0]] == stock[:self.starts[0]], "the rule is not Megatron's"
            else:
                self._samples = []
                for launch, (a, b) in zip(self.base["launches"], zip(self.bounds, self.bounds[1:])):
                    self._samples += DATASETS[launch["train"]][:b - a]
        return self._samples

    def eval_samples(self, split: str, launch: int = 0) -> list[str]:
        return DATASETS[self.base["launches"][launch][split]]

    # -- streams --------------------------------------------------------------------

    def _digests(self, microbatches: list[list[int]]) -> list[list[str]]:
        """[launch, ids...] micro-batches as digests (continue: the ids are the run's samples)."""
        if self.mode == "continue":
            samples = self.train_samples()
            return [[samples[i] for i in mb[1:]] for mb in microbatches]
        keys = [launch["train"] for launch in self.base["launches"]]
        return [[DATASETS[keys[mb[0]]][i] for i in mb[1:]] for mb in microbatches]

    def train_stream(self, rank: int) -> list[list[str]]:
        """Each micro-batch `rank` reads over the run, in order (exact cells only)."""
        assert self.exact_stream
        return self._digests(self.base["train"][rank])

    def resumed(self) -> dict[str, dict]:
        """{dp=D,mbs=M,from=C: recorded relaunch} (continue: the stock run's, whose single sampler
        reads the same ids)."""
        return self.base["resumed"]

    def resumed_stream(self, key: str, rank: int) -> tuple[list[list[str]], int]:
        """(the micro-batches a job relaunched as `key` reads on `rank`, how many of them are in the
        launch it resumes in: a stream folder holds at least those)."""
        mbs = self.resumed()[key]["streams"][rank]
        return self._digests(mbs), sum(mb[0] == mbs[0][0] for mb in mbs)

    def valid_steps(self) -> list[tuple[int, list[list[list[str]]]]]:
        """Every evaluation step of the run: (its launch, each rank's micro-batches as digests)."""
        keys = [launch["valid"] for launch in self.base["launches"]]
        return [(s["launch"], [[[DATASETS[keys[s["launch"]]][i] for i in mb] for mb in rank] for rank in s["ranks"]])
                for s in self.base["valid"]]

    def test_steps(self, launch: int) -> list[list[list[list[str]]]]:
        """The test evaluation of a launch: each step's per-rank micro-batches as digests."""
        key = self.base["launches"][launch]["test"]
        steps = self.base["test"][launch]
        return [[[[DATASETS[key][i] for i in mb] for mb in rank] for rank in step] for step in steps]

    def microbatches_before(self, iteration: int) -> int:
        """Micro-batches each rank read before 1-based `iteration`."""
        return self.consumed[iteration - 1] // self.group


def continue_rule(bounds: list[int], gpt_keys: dict[str, str]) -> list[str]:
    """docs/phases.md's continue rule, sample by sample: in phase k the first dataset d
    maximising w_d x max(i, 1) - (its draws in the phase so far), w normalised as Megatron's
    blend does; d serves its GPTDataset's next sample (from sample 0 again after its last)."""
    position = dict.fromkeys(gpt_keys, 0)
    out = []
    for blend, a, b in zip(mc.PHASES, bounds, bounds[1:]):
        names = [blend] if isinstance(blend, str) else list(blend)
        weights = np.array([1.0] if isinstance(blend, str) else list(blend.values()), dtype=np.float64)
        weights /= np.sum(weights)
        drawn = [0] * len(names)
        for i in range(b - a):
            errors = [float(w) * max(i, 1) - c for w, c in zip(weights, drawn)]
            j = errors.index(max(errors))
            gpt = DATASETS[gpt_keys[names[j]]]
            out.append(gpt[position[names[j]] % len(gpt)])
            drawn[j] += 1
            position[names[j]] += 1
    return out
