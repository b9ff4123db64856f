"""The C index builders against straightforward Python statements of
megatron-core's algorithms, and against hostile inputs."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfs.errors import NativeError
from mmfs.formats.base import ArraySpec
from mmfs.megatron.indices.blend import build_blending_indices, build_exhaustive_blending_indices
from mmfs.megatron.indices.gpt import GptParams, build_document_index, build_sample_index, plan_epochs
from mmfs.native import ffi, lib, pointer
from mmfs.storage.memory import MemorySource


def reference_sample_index(sizes, doc_index, S, E, T, drop_last, e):
    """helpers.cpp build_sample_idx, line by line (release build: no assert)."""
    total = E * T - e
    n = total // S if drop_last else int(math.ceil(np.float32(total) / np.float32(S)))
    rows = [(0, 0)]
    pos, off = 0, 0
    while len(rows) <= n:
        remaining = S + e
        while remaining != 0:
            length = sizes[doc_index[pos]] - off
            remaining -= length
            if remaining <= 0:
                off += remaining + length - e
                remaining = 0
            else:
                if pos == len(doc_index) - 1:
                    off = sizes[doc_index[pos]] - e
                    break
                pos += 1
                off = 0
        rows.append((pos, off))
    return np.array(rows, dtype=np.int32)


def reference_blend(weights, size):
    counts = [0] * len(weights)
    di, dsi = [], []
    for i in range(size):
        at = max(float(i), 1.0)
        errors = [w * at - c for w, c in zip(weights, counts)]
        k = errors.index(max(errors))
        di.append(k)
        dsi.append(counts[k])
        counts[k] += 1
    return di, dsi


def params(S, e, drop_last, num_samples, n):
    return GptParams("x", "valid", 0, n, num_samples, S, 1, bool(e), drop_last, "1", None, {})


def document_and_sample_index(sizes, S, e, drop_last, num_samples, seed):
    """Megatron's plan, document index and (mmfs's) sample index; None when the
    tokens do not exceed the extra one (Megatron cannot sample then)."""
    T = int(sizes.sum())
    if T <= e:
        return None
    p = params(S, e, drop_last, num_samples, len(sizes))
    plan = plan_epochs(p, T)
    doc = build_document_index(0, len(sizes), plan.num_epochs, np.random.RandomState(seed),
                               plan.separate_final_epoch)
    return p, plan, T, doc, build_sample_index(sizes, doc, p, plan)


lengths_st = st.lists(st.integers(0, 60), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, S=st.integers(1, 50), e=st.integers(0, 1), drop_last=st.booleans(),
       num_samples=st.one_of(st.none(), st.integers(0, 30)), seed=st.integers(0, 2**32 - 1))
def test_sample_index_matches_reference(lengths, S, e, drop_last, num_samples, seed):
    sizes = np.array(lengths, dtype=np.int32)
    built = document_and_sample_index(sizes, S, e, drop_last, num_samples, seed)
    if built is None:
        return
    p, plan, T, doc, ours = built
    expected = reference_sample_index(sizes, doc, S, plan.num_epochs, T, drop_last, e)
    assert np.array_equal(ours, expected)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=40), S=st.integers(1, 50),
       e=st.integers(0, 1), num_samples=st.one_of(st.none(), st.integers(0, 30)),
       seed=st.integers(0, 2**32 - 1))
def test_samples_cut_the_document_stream(lengths, S, e, num_samples, seed):
    """Unshuffled samples, overlapping by e tokens, are the epochs' token stream."""
    from mmfs.megatron.arrays import ArrayPlacer
    from mmfs.megatron.reader import GptReader, TokenSource

    rng = np.random.RandomState(seed)
    tokens = [rng.randint(0, 60000, size=n).astype(np.uint16) for n in lengths]
    sizes = np.array(lengths, dtype=np.int32)
    built = document_and_sample_index(sizes, S, e, True, num_samples, seed)
    if built is None:
        return
    p, plan, T, doc, sample_index = built
    N = sample_index.shape[0] - 1
    assert N == (plan.num_epochs * T - e) // S
    if num_samples is not None:
        assert N >= num_samples
    stream = np.concatenate([tokens[d] for d in doc])

    class Data:  # an in-memory dataset with the reader's interface
        data = np.frombuffer(b"".join(t.tobytes() for t in tokens) or b"\0", dtype=np.uint8)
        sequence_lengths = sizes
        sequence_pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * 2]).astype(np.int64)
        num_sequences = len(sizes)
        document_indices = np.arange(len(sizes) + 1, dtype=np.int64)
        dtype = np.dtype(np.uint16)
        arrays = {name: ArraySpec(MemorySource(name, arr), 0, arr.dtype, arr.size) for name, arr in (
            ("tokens", data), ("sequence_lengths", sizes), ("sequence_pointers", sequence_pointers),
            ("document_indices", document_indices))}

    class Gpt:
        spec = type("Spec", (), {"name": "x", "file": "x"})
        params = p
        document_index = doc
        shuffle_index = np.arange(N, dtype=np.uint32)

        @classmethod
        def raw(cls, name):
            return getattr(cls, name)

        @classmethod
        def recorded(cls, name):  # in memory: no record's facts
            return None

        def __len__(self):
            return self.sample_index.shape[0] - 1

    Gpt.sample_index = sample_index
    placer = ArrayPlacer()
    reader = GptReader(Gpt(), TokenSource(Data, placer), ffi.new("mmfs_gpt *"), placer)
    out = np.zeros(S + e, dtype=np.uint16)
    for k in range(N):
        n = read_unshuffled(reader.c, k, S + e, ffi.cast("void *", out.ctypes.data))
        assert n == S + e
        assert np.array_equal(out, stream[k * S : k * S + S + e])


@settings(max_examples=200, deadline=None)
@given(weights=st.lists(st.floats(0.01, 10), min_size=1, max_size=6), size=st.integers(0, 300))
def test_blending_matches_reference(weights, size):
    w = (np.array(weights) / np.sum(weights)).tolist()
    got = build_blending_indices(w, size)
    di, dsi = reference_blend(w, size)
    assert got["dataset_index"].tolist() == di
    assert got["dataset_sample_index"].tolist() == dsi


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=6))
def test_exhaustive_blending_takes_every_sample_once(sizes):
    got = build_exhaustive_blending_indices(sizes)
    di, dsi = got["dataset_index"], got["dataset_sample_index"]
    assert len(di) == sum(sizes)
    for k, n in enumerate(sizes):
        assert dsi[di == k].tolist() == list(range(n))
    # Each step picks the unspent dataset furthest behind its share (first on ties).
    total = sum(sizes)
    counts = [0] * len(sizes)
    for i, k in enumerate(di):
        at = max(float(i), 1.0)
        errors = [(sizes[d] / total) * at - counts[d] if counts[d] < sizes[d] else -math.inf
                  for d in range(len(sizes))]
        assert k == errors.index(max(errors))
        counts[k] += 1


# -- hostile inputs: errors, never a crash ---------------------------------------------

def call_build(sizes, doc, S=4, E=1, T=None, drop_last=1, e=1, rows=None, wide=0):
    sizes = np.asarray(sizes, dtype=np.int32)
    doc = np.asarray(doc, dtype=np.int32)
    T = int(sizes.sum()) if T is None else T
    n = lib.mmfs_sample_count(E, T, S, drop_last, e)
    rows = n + 1 if rows is None else rows
    out = np.zeros((max(rows, 1), 2), dtype=np.int64 if wide else np.int32)
    return lib.mmfs_build_sample_index(
        pointer(sizes, "int32_t *"), len(sizes), pointer(doc, "int32_t *"), len(doc),
        S, E, T, drop_last, e, ffi.cast("void *", out.ctypes.data), rows, wide)


@pytest.mark.parametrize("case", [
    dict(sizes=[5, 5], doc=[0, 7]),                 # document id past the sequences
    dict(sizes=[5, 5], doc=[-1, 0]),                # negative document id
    dict(sizes=[5, -3, 9], doc=[0, 1, 2]),          # negative length
    dict(sizes=[5, 5], doc=[0, 1], T=0),            # zero tokens
    dict(sizes=[5, 5], doc=[0, 1], S=0),            # zero sequence length
    dict(sizes=[5, 5], doc=[0, 1], S=-4),           # negative sequence length
    dict(sizes=[5, 5], doc=[0, 1], E=0),            # zero epochs
    dict(sizes=[5, 5], doc=[0, 1], e=2),            # extra token not 0/1
    dict(sizes=[5, 5], doc=[0, 1], rows=1),         # output too small
    dict(sizes=[5, 5], doc=[0, 1], rows=99),        # output of the wrong size
    dict(sizes=[5, 5], doc=[], T=10),               # no documents
    dict(sizes=[5, 5], doc=[0, 1], T=2**62, E=4),   # token count overflows int64
])
def test_hostile_sample_index_inputs_fail_cleanly(case):
    assert call_build(**case) < 0


def test_lying_token_count_stays_in_bounds():
    """A tokens_per_epoch larger than the lengths: the loop stops at the last document."""
    assert call_build([5, 5], [0, 1], T=1000, drop_last=0, rows=None) == 0


def test_hostile_blend_inputs_fail_cleanly():
    w = np.array([0.5, 0.5])
    assert lib.mmfs_build_blending_index(pointer(w, "double *"), 0, 5, ffi.NULL, ffi.NULL) < 0
    assert lib.mmfs_build_blending_index(pointer(w, "double *"), 2, -1, ffi.NULL, ffi.NULL) < 0
    assert lib.mmfs_build_blending_index(pointer(w, "double *"), 2, 5, ffi.NULL, ffi.NULL) < 0
    s = np.array([3, 0], dtype=np.int64)
    with pytest.raises(NativeError):
        build_exhaustive_blending_indices([3, 0])
    with pytest.raises(NativeError):
        build_exhaustive_blending_indices([3, -2])
    out16 = np.zeros(3, dtype=np.int16)
    out64 = np.zeros(3, dtype=np.int64)
    assert lib.mmfs_build_exhaustive_blending_index(
        pointer(s, "int64_t *"), 2, 99, ffi.cast("int16_t *", out16.ctypes.data),
        ffi.cast("int64_t *", out64.ctypes.data)) < 0


def read_unshuffled(g, k: int, tokens: int, out) -> int:
    """Unshuffled sample k of the GPTDataset g (pad -1, uint16), read as sample k of a split
    of g alone whose shuffle index is the identity."""
    n = max(k, 0) + 1
    identity = np.arange(n, dtype=np.int64)
    g.shuffle_index = dict(data=ffi.cast("uint8_t *", identity.ctypes.data), count=n, dtype=5)
    split = ffi.new("mmfs_split *", dict(gpts=g, num_gpts=1, num_samples=n, sample_tokens=tokens,
                                         pad=-1, out_dtype=8))
    return lib.mmfs_read_split_sample(split, k, out)


def test_hostile_sample_reads_fail_cleanly():
    """Corrupt indices or pointers give an error code, never a read out of bounds."""
    data = np.arange(20, dtype=np.uint16).view(np.uint8)
    lengths = np.array([10, 10], dtype=np.int32)
    pointers = np.array([0, 20], dtype=np.int64)
    def array(a, code):
        return dict(data=ffi.cast("uint8_t *", a.ctypes.data), count=a.size, dtype=code)

    src = ffi.new("mmfs_source *", dict(bytes=array(data, 1), dtype=8, lengths=array(lengths, 4),
                                        pointers=array(pointers, 5)))
    out = np.zeros(64, dtype=np.uint16)
    outp = ffi.cast("void *", out.ctypes.data)

    def read(doc, rows, k=0, tokens=5):
        doc = np.asarray(doc, dtype=np.int32)
        rows = np.asarray(rows, dtype=np.int32)
        g = ffi.new("mmfs_gpt *", dict(source=src, doc_index=array(doc, 4), sample_index=array(rows, 4),
                                       extra=1))
        return read_unshuffled(g, k, tokens, outp)

    assert read([0, 1], [[0, 0], [0, 4]]) == 5                 # sound
    assert read([0, 1], [[0, 0], [0, 4]], k=1) < 0             # sample past the end
    assert read([0, 1], [[0, 0], [0, 4]], k=-1) < 0
    assert read([0, 5], [[0, 0], [1, 4]]) < 0                  # sequence id out of range
    assert read([0, 1], [[0, 0], [3, 4]]) < 0                  # row past document index
    assert read([0, 1], [[1, 0], [0, 4]]) < 0                  # rows going backwards
    assert read([0, 1], [[0, 8], [0, 2]]) < 0                  # negative length
    assert read([0, 1], [[0, 0], [0, 30]]) < 0                 # past the sequence's end
    assert read([0, 1], [[0, -3], [0, 2]]) < 0                 # negative offset
    assert read([0, 1], [[0, 0], [1, 9]], tokens=5) < 0        # more tokens than the sample holds
    pointers[1] = 10**12                                       # pointer outside the file
    assert read([0, 1], [[0, 0], [1, 2]], tokens=30) < 0
