"""A run in phases (issue 27, docs/phases.md): the config's `phases:`, the run's
blend under both phase modes, checked against stock builds (which the golden
tests hold to megatron-core), a slow sample-by-sample reference of the continue
rule, properties over random phase lists, and a real mount across a boundary."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfs.errors import ConfigError
from mmfs.megatron.corpus import open_corpus
from mmfs.megatron.phasefacts import served_before
from mmfs.megatron.phases import PhaseSlice, continue_blend, megatron_weights, wrap
from mmfs.mount.contract import XATTR_DATASET, XATTR_PHASE, XATTR_SAMPLES

DATA = Path(__file__).resolve().parent / "golden" / "data"
TRAINING = {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8, "train_iters": 30,
            "eval_interval": 10, "eval_iters": 2}


def ds(name: str, weight: float) -> dict:
    return {"path": str(DATA / name), "weight": weight}


def write(tmp_path: Path, name: str = "run.yaml", **keys) -> str:
    config = {"split": "90,8,2", "sequence_length": 32, "tokenizer": {"eod": 0},
              "cache_dir": str(tmp_path / "cache"), "training": dict(TRAINING), **keys}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return str(path)


TWO_PHASES = [
    {"datasets": [ds("u16_docs", 0.7), ds("u16_multiseq", 0.3)]},
    {"start_iteration": 10, "datasets": [ds("u16_docs", 0.2), ds("u16_multiseq", 0.3), ds("u16_small", 0.5)]},
]
THREE_PHASES = TWO_PHASES + [{"start_iteration": 22, "datasets": [ds("u16_small", 1.0), ds("u16_docs", 3.0)]}]


def slow_served_before(reader) -> list[int]:
    """served_before, walking sample by sample: a sample repeats when its dataset file
    and its pieces (sequence, offset, length) were served earlier in the run."""
    seen: set = set()
    out = []
    for s in reader.indices.slices:
        again = 0
        for i in range(s.start, s.end):
            gpt, k = reader.locate(i)
            key = (gpt.gpt.spec.file, tuple(gpt.pieces(k)))
            again += key in seen
            seen.add(key)
        out.append(again)
    return out


def served(reader) -> list[int]:
    fast = served_before(reader)
    assert fast == slow_served_before(reader)
    return fast


def samples(reader, start: int, end: int) -> list[bytes]:
    return [reader.read(i) for i in range(start, end)]


# -- continue ---------------------------------------------------------------------


def test_continue_first_phase_is_the_stock_blend_sized_to_the_run(tmp_path):
    run = open_corpus(write(tmp_path, phases=THREE_PHASES), progress=False)
    stock = open_corpus(write(tmp_path, "stock.yaml", datasets=THREE_PHASES[0]["datasets"]), progress=False)
    assert run.indices["train"].slices[1].start == 80  # iteration 10 x 8
    assert samples(run.splits["train"], 0, 80) == samples(stock.splits["train"], 0, 80)
    for split in ("valid", "test"):  # not phased
        assert samples(run.splits[split], 0, len(stock.splits[split])) == \
            samples(stock.splits[split], 0, len(stock.splits[split]))


def reference_continue(slices: list[PhaseSlice], lengths: list[int]) -> list[tuple[int, int]]:
    """The continue rule, sample by sample, in plain Python: within a phase, the
    first dataset maximising weight × max(i, 1) − drawn-in-phase; it serves its
    next sample (wrapping after its last)."""
    position = [0] * len(lengths)
    out = []
    for s in slices:
        drawn = [0] * len(s.members)
        for i in range(s.size):
            at = max(i, 1)
            errors = [w * at - c for w, c in zip(s.weights, drawn)]
            j = errors.index(max(errors))
            g = s.members[j]
            out.append((g, position[g] % lengths[g]))
            drawn[j] += 1
            position[g] += 1
    return out


def test_continue_later_phases_follow_the_reference_rule(tmp_path):
    run = open_corpus(write(tmp_path, phases=THREE_PHASES), progress=False)
    train = run.indices["train"]
    expected = reference_continue(train.slices, [len(g) for g in train.gpts])
    got = list(zip(train.blend.dataset_index.tolist(), train.blend.dataset_sample_index.tolist()))
    assert got == expected
    # each dataset goes on from where it stood: u16_docs's samples in phase 1 follow phase 0's
    docs = [k for g, k in got if train.gpts[g].spec.name == "u16_docs"]
    assert docs == list(range(len(docs)))
    assert served(run.splits["train"]) == [0, 0, 0]


def test_a_used_up_dataset_starts_its_next_pass(tmp_path):
    """u16_small, sized by Megatron for 5 % of the run, at 4096 tokens a sample
    holds fewer samples than phase 1 draws from it."""
    phases = [{"datasets": [ds("u16_docs", 0.95), ds("u16_small", 0.05)]},
              {"start_iteration": 2, "datasets": [ds("u16_small", 1.0)]}]
    path = write(tmp_path, phases=phases, sequence_length=4096)
    run = open_corpus(path, progress=False)
    train = run.indices["train"]
    small = train.gpts[1]
    n = len(small)
    assert train.draws[1, 1] > n  # used up within the phase
    before = int(train.positions[1, 1])
    ids = train.blend.dataset_sample_index[16:].tolist()
    first = n - before
    assert ids == [(before + j) % n for j in range(len(ids))]  # on past its last sample: from its first
    again = open_corpus(path, progress=False).indices["train"]  # the next pass is cached too
    assert again.blend.from_cache and np.array_equal(again.blend.dataset_sample_index,
                                                     train.blend.dataset_sample_index)
    assert served(run.splits["train"]) == [0, len(ids) - first]


@st.composite
def phase_lists(draw):
    datasets = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(1, 300), min_size=datasets, max_size=datasets))
    count = draw(st.integers(1, 4))
    cuts = sorted(draw(st.sets(st.integers(1, 599), min_size=count - 1, max_size=count - 1)))
    bounds = [0, *cuts, 600]
    slices = []
    for start, end in zip(bounds, bounds[1:]):
        members = draw(st.lists(st.integers(0, datasets - 1), min_size=1, max_size=datasets, unique=True))
        weights = draw(st.lists(st.floats(0.01, 10), min_size=len(members), max_size=len(members)))
        slices.append(PhaseSlice(start, end, tuple(members), tuple(megatron_weights(weights))))
    return slices, lengths


@settings(max_examples=150, deadline=None)
@given(phase_lists())
def test_continue_properties(case):
    slices, lengths = case
    run = continue_blend(slices, len(lengths))
    positions = wrap(run.dataset_index, run.dataset_sample_index, lengths)
    pairs = list(zip(run.dataset_index.tolist(), positions.tolist()))
    assert pairs == reference_continue(slices, lengths)
    # no (dataset, sample) pair twice before that dataset's used up
    seen: dict[int, set] = {}
    passes = dict.fromkeys(range(len(lengths)), 0)
    for g, k in pairs:
        if len(seen.setdefault(g, set())) == lengths[g]:
            seen[g] = set()
            passes[g] += 1
        assert k not in seen[g]
        seen[g].add(k)
    # realised shares within the greedy's error of each phase's weights
    for s, drawn in zip(slices, run.draws):
        for g, w in zip(s.members, s.weights):
            assert abs(drawn[g] - w * s.size) <= len(s.members), (drawn[g], w * s.size)
    # append-only: a different last phase (or none) changes nothing before it
    if len(slices) > 1:
        shorter = continue_blend(slices[:-1], len(lengths))
        start = slices[-1].start
        assert np.array_equal(shorter.dataset_index, run.dataset_index[:start])
        assert np.array_equal(shorter.dataset_sample_index, run.dataset_sample_index[:start])
        last = slices[-1]
        changed = PhaseSlice(last.start, last.end, last.members[::-1], last.weights)
        other = continue_blend([*slices[:-1], changed], len(lengths))
        assert np.array_equal(other.dataset_sample_index[:start], run.dataset_sample_index[:start])
    # positions are closed-form sums of earlier draws
    assert np.array_equal(run.positions[-1], np.bincount(run.dataset_index, minlength=len(lengths)))


def test_append_only_on_real_datasets(tmp_path):
    two = open_corpus(write(tmp_path, "two.yaml", phases=TWO_PHASES), progress=False)
    three = open_corpus(write(tmp_path, "three.yaml", phases=THREE_PHASES), progress=False)
    start = three.indices["train"].slices[2].start
    assert samples(two.splits["train"], 0, start) == samples(three.splits["train"], 0, start)


# -- restart --------------------------------------------------------------------------


def test_restart_phases_are_stock_blends_sized_to_each_phase(tmp_path):
    run = open_corpus(write(tmp_path, phases=THREE_PHASES, phase_mode="restart"), progress=False)
    train = run.indices["train"]
    for k, s in enumerate(train.slices):
        stock_path = write(tmp_path, f"stock{k}.yaml", datasets=THREE_PHASES[k]["datasets"],
                           samples={"train": s.size, "valid": 64, "test": 16}, training=None)
        stock = open_corpus(stock_path, progress=False)
        assert samples(run.splits["train"], s.start, s.end) == samples(stock.splits["train"], 0, s.size), k
    again = served(run.splits["train"])
    assert again[0] == 0 and again[1] > 0  # a relaunched phase re-reads what phase 0 read


# -- against megatron-core 0.19.2 (tests/reference/record_phases.py) -------------------

REFERENCE = json.loads((Path(__file__).resolve().parent / "reference" / "phases.json").read_text())["cases"]


def reference_config(tmp_path: Path, name: str, mode: str) -> str:
    case = REFERENCE[name]
    link = tmp_path / "data"
    if not link.exists():
        link.symlink_to(DATA, target_is_directory=True)
    phases = []
    for k, (start, blend) in enumerate(case["phases"]):
        entry = {"datasets": [{"path": p, "weight": w} for p, w in blend.items()]}
        phases.append(entry if k == 0 else {"start_iteration": start, **entry})
    training = {"data_parallel_size": 1, "micro_batch_size": 4, **case["training"]}
    config = {"phases": phases, "phase_mode": mode, "split": case["split"], "seed": case["seed"],
              "sequence_length": case["sequence_length"], "tokenizer": {"eod": 0},
              "cache_dir": str(tmp_path / "cache"), "training": training}
    path = tmp_path / f"{name}-{mode}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def digests(reader, start: int, end: int) -> list[str]:
    import hashlib

    return [hashlib.sha256(np.frombuffer(reader.read(i), dtype=reader.dtype).astype(np.int64).tobytes())
            .hexdigest()[:16] for i in range(start, end)]


@pytest.mark.parametrize("name", [n for n in REFERENCE if "restart" in REFERENCE[n]])
def test_restart_is_megatron_relaunched_per_phase(tmp_path, name):
    case = REFERENCE[name]
    corpus = open_corpus(reference_config(tmp_path, name, "restart"), progress=False)
    train = corpus.indices["train"]
    assert len(train.slices) == len(case["restart"])
    for s, expected in zip(train.slices, case["restart"]):
        assert digests(corpus.splits["train"], s.start, s.end) == expected
    for split in ("valid", "test"):  # not phased: the first phase's arguments
        assert digests(corpus.splits[split], 0, len(case[split])) == case[split]
    # repeats across relaunches, counted fast, agree with the sample-by-sample walk (and with the digests)
    again = served(corpus.splits["train"])
    seen: set = set()
    by_digest = []
    for phase in case["restart"]:
        by_digest.append(sum(d in seen for d in phase))
        seen.update(phase)
    assert again == by_digest


@pytest.mark.parametrize("name", list(REFERENCE))
def test_continue_first_phase_is_megatron(tmp_path, name):
    case = REFERENCE[name]
    corpus = open_corpus(reference_config(tmp_path, name, "continue"), progress=False)
    train = corpus.indices["train"]
    first = case.get("continue_first_phase") or case["first_phase_full"][:train.slices[1].start]
    assert train.slices[1].start == len(first)
    assert digests(corpus.splits["train"], 0, len(first)) == first
    for split in ("valid", "test") if "valid" in case else ():
        assert digests(corpus.splits[split], 0, len(case[split])) == case[split]
    # and the later phases follow the rule, from where each dataset stood
    expected = reference_continue(train.slices, [len(g) for g in train.gpts])
    assert list(zip(train.blend.dataset_index.tolist(), train.blend.dataset_sample_index.tolist())) == expected


# -- the mount --------------------------------------------------------------------


def test_mount_serves_the_phased_run(tmp_path):
    from mount_fixtures import mounted

    path = write(tmp_path, phases=TWO_PHASES)
    run = open_corpus(path, progress=False)
    (tmp_path / "mnt").mkdir()
    with mounted(path, tmp_path / "mnt") as m:
        info = json.loads((m.path / "mmfs.json").read_text())
        phases = info["phases"]
        assert phases["phase_mode"] == "continue"
        assert [(p["start_iteration"], p["start_sample"], p["end_sample"]) for p in phases["phases"]] == \
            [(0, 0, 80), (10, 80, 240)]
        second = {d["name"]: d for d in phases["phases"][1]["datasets"]}
        first = {d["name"]: d for d in phases["phases"][0]["datasets"]}
        assert second["u16_docs"]["position_before"] == first["u16_docs"]["draws"]
        assert second["u16_small"]["position_before"] == 0
        for i in (78, 79, 80, 81):
            f = m.path / "train" / "samples" / f"{i:07d}.bin"
            assert f.read_bytes() == run.splits["train"].read(i)
            assert os.getxattr(f, XATTR_PHASE).decode() == str(int(i >= 80))
            assert os.getxattr(f, XATTR_DATASET).decode() == run.splits["train"].provenance(i)[0]
        valid = m.path / "valid" / "samples" / "0000000.bin"
        assert XATTR_PHASE not in os.listxattr(valid)
        # a rank's micro-batches read the same run: rank 1's micro-batches around the boundary
        ranks = m.path / "train" / "ranks" / "001"
        seen = []
        for j in (18, 19, 20, 21):  # iterations 10 and 11: two micro-batches of rank 1 each
            f = ranks / f"{j:07d}.bin"
            ids = [int(x) for x in os.getxattr(f, XATTR_SAMPLES).split()]
            assert f.read_bytes() == b"".join(run.splits["train"].read(i) for i in ids)
            seen += ids
        assert min(seen) < 80 <= max(seen)


# -- mistakes ---------------------------------------------------------------------


@pytest.mark.parametrize("phases, extra, key, fragment", [
    ([TWO_PHASES[0], {**TWO_PHASES[1], "start_iteration": 0}], {}, "phases[1].start_iteration",
     "not after phases[0]"),
    ([TWO_PHASES[0], {**TWO_PHASES[1], "start_iteration": 10}, {**TWO_PHASES[1], "start_iteration": 5}], {},
     "phases[2].start_iteration", "not after phases[1]"),
    ([TWO_PHASES[0], {"start_samples": 84, "datasets": TWO_PHASES[1]["datasets"]}], {},
     "phases[1].start_samples", "falls inside iteration 11"),
    ([TWO_PHASES[0], {"start_tokens": 84 * 32, "datasets": TWO_PHASES[1]["datasets"]}], {},
     "phases[1].start_tokens", "a phase starts where a global batch starts"),
    ([TWO_PHASES[0], {"start_iteration": 10, "datasets": [ds("u16_docs", 0), ds("u16_small", 0)]}], {},
     "phases[1].datasets[0].weight", "positive"),
    ([TWO_PHASES[0], {"start_iteration": 10, "datasets": [ds("nope", 1.0)]}], {},
     "phases[1].datasets[0].path", ""),
    ([TWO_PHASES[0], {**TWO_PHASES[1], "sequence_length": 64}], {}, "phases[1].sequence_length",
     "cannot change sequence_length"),
    ([TWO_PHASES[0], {**TWO_PHASES[1], "split": "1,0,0"}], {}, "phases[1].split", "cannot change split"),
    ([TWO_PHASES[0], {**TWO_PHASES[1], "tokenizer": {"eod": 1}}], {}, "phases[1].tokenizer", "cannot change"),
    ([TWO_PHASES[0], {"datasets": TWO_PHASES[1]["datasets"]}], {}, "phases[1].start_iteration", "missing"),
    ([{**TWO_PHASES[0], "start_iteration": 3}], {}, "phases[0].start_iteration", "starts at 0"),
    ([TWO_PHASES[0], {**TWO_PHASES[1], "start_iteration": 30}], {}, "phases[1].start_iteration",
     "past the end of training"),
    (TWO_PHASES, {"phase_mode": "later"}, "phase_mode", "not a phase mode"),
    ([TWO_PHASES[0], {"start_iteration": 10, "datasets": [ds("u16_docs", 1.0), ds("u16_small", 1.0),
                                                          ds("u16_docs", 2.0)]}], {},
     "phases[1].datasets[2].path", "a second time"),
    ([TWO_PHASES[0], {"start_iteration": 10, "datasets": [{"path": str(DATA / "u16_docs")},
                                                          {"path": str(DATA / "u16_small")}]}], {},
     "phases[1].datasets[0].weight", "missing"),
])
def test_mistakes_are_one_line_naming_the_key(tmp_path, phases, extra, key, fragment):
    with pytest.raises(ConfigError) as err:
        open_corpus(write(tmp_path, phases=phases, **extra), progress=False)
    message = str(err.value)
    assert "\n" not in message
    assert message.split(": ")[1] == key, message
    assert fragment in message, message


def test_restart_needs_a_fixed_batch_size(tmp_path):
    training = {**TRAINING, "global_batch_size": 16, "rampup_batch_size": [4, 4, 64]}
    with pytest.raises(ConfigError, match=r": phase_mode: restart is Megatron's --phase-transition-iterations"):
        open_corpus(write(tmp_path, phases=TWO_PHASES, phase_mode="restart", training=training), progress=False)


def test_phases_with_blend_per_split_are_refused(tmp_path):
    per_split = {"train": TWO_PHASES[0]["datasets"], "valid": TWO_PHASES[0]["datasets"], "test": None}
    path = write(tmp_path, phases=TWO_PHASES, blend_per_split=per_split, split=None)
    with pytest.raises(ConfigError, match=r": phases: phases change the train blend"):
        open_corpus(path, progress=False)


def test_a_phase_in_megatrons_data_path_form_and_a_ramp_up(tmp_path):
    """`data_path` words in a phase, and boundaries counted through a batch-size ramp-up."""
    training = {**TRAINING, "global_batch_size": 16, "rampup_batch_size": [4, 4, 64]}
    words = f"0.2 {DATA / 'u16_docs'} 0.8 {DATA / 'u16_small'}"
    phases = [TWO_PHASES[0], {"start_iteration": 12, "data_path": words}]
    corpus = open_corpus(write(tmp_path, phases=phases, training=training), progress=False)
    schedule = corpus.config.training.schedule
    train = corpus.indices["train"]
    assert train.slices[1].start == schedule.consumed_before(13)
    assert [g.spec.name for g in train.gpts] == ["u16_docs", "u16_multiseq", "u16_small"]
    assert train.slices[1].weights == tuple(megatron_weights([0.2, 0.8]))


def test_no_phases_is_todays_config(tmp_path):
    path = write(tmp_path, datasets=TWO_PHASES[0]["datasets"])
    corpus = open_corpus(path, progress=False)
    assert type(corpus.indices["train"]).__name__ == "SplitIndices"
    assert corpus.config.phases is None and "phases" not in corpus.config.as_dict()


# -- mmfs phases ------------------------------------------------------------------


def test_phases_command(tmp_path):
    from mount_fixtures import mmfs

    path = write(tmp_path, phases=THREE_PHASES, phase_mode="restart")
    out = mmfs("phases", path, "--json", "-q")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["phase_mode"] == "restart"
    first, second, third = report["phases"]
    # single-epoch datasets under one seed: a relaunched phase re-reads each dataset from its first
    # sample, so it repeats min(its draws, the first phase's) of each dataset they share
    drawn = {d["name"]: d["draws"] for d in first["datasets"]}
    again = sum(min(d["draws"], drawn.get(d["name"], 0)) for d in second["datasets"])
    assert (first["served_before"], second["served_before"]) == (0, again) and again > 0
    assert third["start_iteration"] == 22 and third["start_sample"] == 176 and third["end_sample"] == 240
    for p in report["phases"]:
        assert sum(d["draws"] for d in p["datasets"]) == p["samples"]
        for d in p["datasets"]:
            assert d["position_after"] - d["position_before"] == d["draws"]
            assert d["left"] == d["gpt_samples"] - d["position_after"]
            assert abs(d["share"] - d["normalized_weight"]) * p["samples"] <= len(p["datasets"])
    text = mmfs("phases", path, "-q")
    assert text.returncode == 0 and "phase 1: from iteration 10, sample 80 to 176" in text.stdout
    plain = write(tmp_path, "plain.yaml", datasets=TWO_PHASES[0]["datasets"])
    missing = mmfs("phases", plain)
    assert missing.returncode == 2 and missing.stderr.strip().endswith("see docs/phases.md)")
    assert "phases: missing" in missing.stderr and missing.stderr.count("\n") == 1


def test_a_text_dataset_in_phases_is_tokenized_once(tmp_path):
    """A .jsonl dataset named in two phases: one tokenization, one GPTDataset going on."""
    golden = Path(__file__).resolve().parent / "golden" / "preprocess"
    (tmp_path / "corpus.jsonl").write_bytes((golden / "corpus.jsonl").read_bytes())
    tokenizer = {"type": "HuggingFaceTokenizer", "model": str(golden / "hf_tokenizer")}
    phases = [{"datasets": [{"path": "corpus.jsonl", "weight": 1.0}]},
              {"start_iteration": 5, "datasets": [{"path": "corpus.jsonl", "weight": 0.5}, ds("u16_docs", 0.5)]}]
    path = write(tmp_path, phases=phases, tokenizer=tokenizer, sequence_length=128, split="90,5,5",
                 samples={"train": 80, "valid": 8, "test": 8},
                 training={"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8})
    train = open_corpus(path, progress=False).indices["train"]
    assert [g.spec.name for g in train.gpts] == ["corpus", "u16_docs"]
    assert len(list((tmp_path / "cache" / "text").glob("*_document.idx"))) == 1
    assert train.positions[1, 0] == 40 and train.draws[1, 0] == 20  # goes on from where phase 0 left it
