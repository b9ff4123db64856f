"""`mmfs preprocess` against Megatron's own tools/preprocess_data.py output, and on bad input."""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from format_helpers import document_tokens
from mmfs.cli import main
from mmfs.formats.indexed import IndexedDataset
from mmfs.text import source
from mmfs.text.pipeline import _assemble
from mount_fixtures import HANG_GUARD, ROOT

GOLDEN = Path(__file__).parent / "golden" / "preprocess"
CORPUS = GOLDEN / "corpus.jsonl"
HF = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(GOLDEN / "hf_tokenizer")]
BYTES = ["--tokenizer-type", "ByteLevel"]

needs_tokenizers = pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None,
                                      reason="the preprocess extra (tokenizers) is not installed")


def run(*args: str) -> int:
    return main(["-q", "preprocess", *map(str, args)])


def outputs(prefix: Path, key: str = "text") -> tuple[bytes, bytes]:
    return (Path(f"{prefix}_{key}_document.bin").read_bytes(), Path(f"{prefix}_{key}_document.idx").read_bytes())


@needs_tokenizers
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("eod, golden", [(True, "hf"), (False, "noeod")])
def test_golden_byte_identical(tmp_path, workers, eod, golden):
    prefix = tmp_path / "out"
    flags = ["--append-eod"] if eod else []
    assert run("--input", CORPUS, "--output-prefix", prefix, *HF, *flags, "--workers", workers) == 0
    assert outputs(prefix) == outputs(GOLDEN / golden)


@needs_tokenizers
def test_gzip_input_and_small_chunks_any_workers(tmp_path, monkeypatch):
    """Many small chunks over 1 and 3 workers: order kept, the same bytes as Megatron's."""
    monkeypatch.setattr(source, "CHUNK_LINES", 97)
    gz = tmp_path / "corpus.jsonl.gz"
    gz.write_bytes(gzip.compress(CORPUS.read_bytes()))
    for workers in (1, 3):
        prefix = tmp_path / f"w{workers}"
        assert run("--input", gz, "--output-prefix", prefix, *HF, "--append-eod", "--workers", workers) == 0
        assert outputs(prefix) == outputs(GOLDEN / "hf")


@needs_tokenizers
@pytest.mark.skipif(importlib.util.find_spec("zstandard") is None and sys.version_info < (3, 14),
                    reason="reading .zst needs zstandard or Python >= 3.14")
def test_zstd_input_of_two_frames(tmp_path):
    data = CORPUS.read_bytes()
    zst = tmp_path / "corpus.jsonl.zst"
    if importlib.util.find_spec("zstandard"):
        import zstandard

        compress = zstandard.ZstdCompressor().compress
    else:
        from compression import zstd

        compress = zstd.compress
    zst.write_bytes(compress(data[:400_001]) + compress(data[400_001:]))
    assert run("--input", zst, "--output-prefix", tmp_path / "z", *HF, "--append-eod", "--workers", 2) == 0
    assert outputs(tmp_path / "z") == outputs(GOLDEN / "hf")


def megatron_documents(texts_per_doc: list[list[list[int]]], eod: int | None) -> tuple[list[int], list[int], list[int]]:
    """Megatron's per-document loop (tools/preprocess_data.py Encoder.encode + add_document)."""
    tokens, lengths, doc_index = [], [], [0]
    for texts in texts_per_doc:
        doc_ids, lens = [], []
        for ids in texts:
            if ids:
                doc_ids += ids
                lens.append(len(ids))
        if doc_ids and eod is not None:
            doc_ids.append(eod)
            lens[-1] += 1
        tokens += doc_ids
        lengths += lens
        doc_index.append(len(lengths))
    return tokens, lengths, doc_index


@settings(max_examples=200, deadline=None)
@given(docs=st.lists(st.lists(st.lists(st.integers(0, 255), max_size=4), max_size=3), max_size=6),
       eod=st.sampled_from([None, 256]))
def test_assemble_matches_megatrons_loop(docs, eod):
    flat = [ids for texts in docs for ids in texts]
    tokens = np.array([t for ids in flat for t in ids], dtype=np.int64)
    lengths = np.array([len(ids) for ids in flat], dtype=np.int64)
    part = _assemble(tokens, lengths, np.array([len(t) for t in docs], dtype=np.int64), eod, np.dtype(np.uint16))
    want_tokens, want_lengths, want_index = megatron_documents(docs, eod)
    assert np.frombuffer(part.tokens, np.uint16).tolist() == want_tokens
    assert part.sequence_lengths.tolist() == want_lengths
    assert np.concatenate([[0], np.cumsum(part.document_sizes)]).tolist() == want_index


def test_byte_level_round_trip(tmp_path, capsys):
    docs = [{"text": "hello", "title": "a"}, {"text": "", "title": "empty text"},
            {"text": "ünïcødé 🙂\r\nline", "title": ""}, {"text": ["two ", "", "sentences"], "title": "x"}]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    prefix = tmp_path / "bytes"
    assert run("--input", jsonl, "--output-prefix", prefix, *BYTES, "--append-eod",
               "--json-keys", "text", "title") == 0
    for key in ("text", "title"):
        ds = IndexedDataset(f"{prefix}_{key}_document")
        assert ds.dtype == np.uint16 and ds.num_documents == len(docs)
        for d, doc in enumerate(docs):
            texts = doc[key] if isinstance(doc[key], list) else [doc[key]]
            want = "".join(texts).encode()
            got = document_tokens(ds, d).tolist()
            assert got == (list(want) + [256] if want else [])
            assert len(ds.document_sequences(d)) == sum(1 for t in texts if t)
        assert main(["-q", "verify", f"{prefix}_{key}_document"]) == 0
        capsys.readouterr()
        assert main(["info", "--json", f"{prefix}_{key}_document"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["num_documents"] == len(docs) and info["dtype"] == "uint16"


def test_skip_bad_lines_counts_them(tmp_path, caplog):
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_bytes(b'{"text": "a"}\n{broken\n\n{"other": 1}\n["text"]\n{"text": 5}\n\xff\xfe\n{"text": "b"}\n')
    prefix = tmp_path / "out"
    caplog.set_level(logging.WARNING, logger="mmfs")
    assert main(["preprocess", "--input", str(jsonl), "--output-prefix", str(prefix), *BYTES,
                 "--skip-bad-lines"]) == 0
    assert "in.jsonl: skipped 6 bad lines" in caplog.text
    ds = IndexedDataset(f"{prefix}_text_document")
    assert [document_tokens(ds, d).tolist() for d in range(ds.num_documents)] == [[97], [98]]


def one_line_error(capsys, *args) -> str:
    assert run(*args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mmfs: error: "), err
    return err


@pytest.mark.parametrize("content, expected", [
    (b'{"text": "a"}\n{"text": "b",}\n', "in.jsonl:2: malformed JSON"),
    (b'{"text": "a"}\r{"text": "b"}\r\n\n', "in.jsonl:3: malformed JSON"),  # a lone \r ends a line
    (b'{"text": "a"}\n{"txt": "b"}\n', "in.jsonl:2: no key 'text'"),
    (b'{"text": null}\n', "in.jsonl:1: key 'text' is not a string"),
    (b'[1, 2]\n', "in.jsonl:1: not a JSON object"),
    (b'{"text": "\xff"}\n', "in.jsonl:1: not UTF-8"),
    (b'{"text": "\\ud800"}\n', "in.jsonl:1: the tokenizer cannot encode"),
    (b'{"text": "a"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n", "in.jsonl:2: malformed JSON (RecursionError"),
    (b'{"text": ' + b"9" * 100_000 + b"}\n", "in.jsonl:1: malformed JSON (ValueError"),
])
def test_bad_line_is_one_line_exit_2(tmp_path, capsys, content, expected):
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_bytes(content)
    prefix = tmp_path / "out"
    err = one_line_error(capsys, "--input", jsonl, "--output-prefix", prefix, *BYTES, "--workers", 2)
    assert expected in err
    assert not list(tmp_path.glob("out*")), "a failed run leaves no output"


def test_bad_setup_is_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "out"
    err = one_line_error(capsys, "--input", CORPUS, "--output-prefix", tmp_path / "missing" / "x", *BYTES)
    assert "output folder does not exist" in err
    err = one_line_error(capsys, "--input", tmp_path / "nope.jsonl", "--output-prefix", out, *BYTES)
    assert "nope.jsonl: cannot read the input" in err
    for name in ("bad.jsonl.gz", "bad.jsonl.zst"):
        (tmp_path / name).write_bytes(b"not compressed at all")
        err = one_line_error(capsys, "--input", tmp_path / name, "--output-prefix", out, *BYTES)
        assert err.startswith(f"mmfs: error: {tmp_path / name}: ")  # (or: .zst needs zstandard)
    err = one_line_error(capsys, "--input", CORPUS, "--output-prefix", out, "--tokenizer-type",
                         "HuggingFaceTokenizer", "--tokenizer-model", tmp_path)
    assert "no tokenizer.json" in err
    assert not list(tmp_path.glob("out*"))


@needs_tokenizers
def test_bad_tokenizer_is_one_line_exit_2(tmp_path, capsys):
    spec = json.loads((GOLDEN / "hf_tokenizer" / "tokenizer.json").read_text())
    out = tmp_path / "out"

    def tokenizer(name: str, tok: dict | str, config: dict | None = None) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tokenizer.json").write_text(tok if isinstance(tok, str) else json.dumps(tok))
        if config is not None:
            (folder / "tokenizer_config.json").write_text(json.dumps(config))
        return folder

    broken = tokenizer("broken", '{"model": {"type": "BPE"')
    err = one_line_error(capsys, "--input", CORPUS, "--output-prefix", out, "--tokenizer-type",
                         "HuggingFaceTokenizer", "--tokenizer-model", broken / "tokenizer.json")
    assert "cannot load the tokenizer" in err
    no_eos = tokenizer("no_eos", spec)
    err = one_line_error(capsys, "--input", CORPUS, "--output-prefix", out, "--tokenizer-type",
                         "HuggingFaceTokenizer", "--tokenizer-model", no_eos, "--append-eod")
    assert "no eos" in err
    gap = json.loads(json.dumps(spec))
    vocab = gap["model"]["vocab"]
    vocab[max(vocab, key=vocab.get)] = 70000
    err = one_line_error(capsys, "--input", CORPUS, "--output-prefix", out, "--tokenizer-type",
                         "HuggingFaceTokenizer", "--tokenizer-model", tokenizer("gap", gap))
    assert "token id 70000 does not fit uint16" in err
    assert not list(tmp_path.glob("out*"))


class FifoInput:
    """A named pipe as --input, fed by a thread until stopped: the run cannot end on its own."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "in.jsonl"
        os.mkfifo(self.path)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self) -> None:
        data = CORPUS.read_bytes()
        try:
            with open(self.path, "wb") as f:
                for _ in range(200):
                    if self.stop.is_set():
                        return
                    f.write(data)
        except BrokenPipeError:
            pass

    def __enter__(self) -> FifoInput:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=HANG_GUARD)


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "mmfs.cli", "preprocess", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)


def workers_of(pid: int) -> list[int]:
    try:
        kids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []
    out = []
    for kid in kids:
        try:
            if "spawn_main" in Path(f"/proc/{kid}/cmdline").read_text():
                out.append(kid)
        except FileNotFoundError:
            pass
    return out


def wait_until_writing(proc: subprocess.Popen, tmp_path: Path, timeout: float = HANG_GUARD) -> list[int]:
    """The worker pids, once the workers run and tokens reach the temporary .bin."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        written = [p.stat().st_size for p in tmp_path.glob("out_text_document.bin.tmp-*")]
        kids = workers_of(proc.pid)
        if len(kids) == 2 and written and written[0] > 0:
            return kids
        time.sleep(0.05)
    raise AssertionError(f"the run did not start writing: {proc.poll()} {proc.stderr.read() if proc.poll() else ''}")


@pytest.mark.parametrize("how", ["sigint", "sigterm", "sigkill"])
def test_interrupted_run_leaves_nothing_finished(tmp_path, how):
    with FifoInput(tmp_path) as fifo:
        proc = start(tmp_path, "--input", fifo.path, "--output-prefix", "out", *BYTES, "--workers", "2")
        wait_until_writing(proc, tmp_path)
        os.kill(proc.pid, {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}[how])
        proc.communicate(timeout=HANG_GUARD)  # also waits for the workers: they hold its stderr
    assert proc.returncode == (-signal.SIGKILL if how == "sigkill" else 130)
    assert not (tmp_path / "out_text_document.bin").exists()
    assert not (tmp_path / "out_text_document.idx").exists()
    left = sorted(p.name for p in tmp_path.glob("out*"))
    if how != "sigkill":
        assert left == []  # cleaned up
    else:
        assert left and all(".tmp-" in name for name in left)
        # the next run removes what the dead one left
        (tmp_path / "small.jsonl").write_text('{"text": "a"}\n')
        again = start(tmp_path, "--input", "small.jsonl", "--output-prefix", "out", *BYTES)
        assert again.wait(timeout=HANG_GUARD) == 0
        assert sorted(p.name for p in tmp_path.glob("out*")) == ["out_text_document.bin",
                                                                 "out_text_document.idx"]


def test_dead_worker_is_an_error_not_a_hang(tmp_path):
    with FifoInput(tmp_path) as fifo:
        proc = start(tmp_path, "--input", fifo.path, "--output-prefix", "out", *BYTES, "--workers", "2")
        os.kill(wait_until_writing(proc, tmp_path)[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 2
    assert "a worker process died" in err and err.count("\n") == 1
    assert not list(tmp_path.glob("out*"))


@needs_tokenizers
def test_hf_special_tokens_as_megatron_core_sees_them(tmp_path):
    """tokenizer_config.json's special tokens, as megatron-core's HuggingFaceTokenizer
    (through transformers) treats them; checked against megatron-core 0.19.2 with
    transformers 5.23 on these same variants."""
    from mmfs.text.tokenizer import HuggingFaceTokenizer

    spec = json.loads((GOLDEN / "hf_tokenizer" / "tokenizer.json").read_text())
    base = len(spec["model"]["vocab"])

    def load(name: str, config: dict | None, tok: dict = spec) -> HuggingFaceTokenizer:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tokenizer.json").write_text(json.dumps(tok))
        if config is not None:
            (folder / "tokenizer_config.json").write_text(json.dumps(config))
        return HuggingFaceTokenizer(str(folder))

    def ids(tok: HuggingFaceTokenizer, text: str) -> list[int]:
        return tok.encode_batch([text])[0].tolist()

    assert load("none", None).eod is None  # no config: no eos, so no --append-eod
    # eos and pad missing from the vocabulary: added in that order, after it.
    tok = load("added", {"eos_token": "<|neweos|>", "pad_token": "<|pad|>"})
    assert (tok.vocab_size, tok.eod) == (base + 2, base)
    assert ids(tok, "a<|neweos|>") == ids(tok, "a") + [base]
    # A special token in the vocabulary but not among tokenizer.json's added tokens is
    # still matched whole in the text.
    bare = dict(spec, added_tokens=[])
    tok = load("in_vocab", {"eos_token": "<|endoftext|>"}, bare)
    assert (tok.vocab_size, tok.eod) == (base, 0)
    assert ids(tok, "<|endoftext|>") == [0]
    # No eos: the sep token is eod; additional special tokens are added after it.
    tok = load("sep", {"sep_token": "<|sep|>", "additional_special_tokens": ["<|c|>"]})
    assert (tok.vocab_size, tok.eod) == (base + 2, base)
    assert ids(tok, "<|c|>") == [base + 1]


def test_a_line_longer_than_the_bound_is_refused(tmp_path, capsys):
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "short"}\n{"text": "' + "x" * 5000 + '"}\n')
    err = one_line_error(capsys, "--input", jsonl, "--output-prefix", tmp_path / "out", *BYTES,
                         "--max-line-bytes", 1000)
    assert "in.jsonl:2: a line longer than 1,000 bytes" in err
    assert run("--input", jsonl, "--output-prefix", tmp_path / "out", *BYTES, "--max-line-bytes", 5012) == 0


def test_the_output_never_overwrites_the_input(tmp_path, capsys):
    jsonl = tmp_path / "out_text_document.bin"
    jsonl.write_text('{"text": "a"}\n')
    err = one_line_error(capsys, "--input", jsonl, "--output-prefix", tmp_path / "out", *BYTES)
    assert "would overwrite the input" in err and jsonl.read_text() == '{"text": "a"}\n'


def test_workers_are_capped_at_the_cpus(tmp_path, caplog):
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "a"}\n')
    assert run("--input", jsonl, "--output-prefix", tmp_path / "out", *BYTES, "--workers", 10**20) == 0
    assert "--workers 100000000000000000000: using" in caplog.text


@pytest.mark.parametrize("cut", ["half", "last-bytes"])
def test_a_truncated_zst_is_refused(tmp_path, capsys, cut):
    zstandard = pytest.importorskip("zstandard")
    data = b"".join(b'{"text": "document %d"}\n' % i for i in range(5000))
    frame = zstandard.ZstdCompressor().compress(data)
    jsonl = tmp_path / "in.jsonl.zst"
    jsonl.write_bytes(frame[: len(frame) // 2] if cut == "half" else frame + frame[:-3])
    err = one_line_error(capsys, "--input", jsonl, "--output-prefix", tmp_path / "out", *BYTES)
    assert "in.jsonl.zst" in err and "ends inside a zstd frame" in err
    assert not list(tmp_path.glob("out*"))
