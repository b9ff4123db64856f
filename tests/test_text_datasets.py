"""Text datasets in a config: a JSONL (plain, .gz, .zst) or Parquet path is tokenized
into the cache on first use by `mmfs preprocess`'s code, and mounts the very samples
of Megatron's own tools/preprocess_data.py output of that file; later builds reuse
it, a changed file or tokenizer is tokenized again; mistakes are one line."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mmfs.cli import main
from mount_fixtures import mmfs, mounted

GOLDEN = Path(__file__).parent / "golden" / "preprocess"
CORPUS = GOLDEN / "corpus.jsonl"
TOKENIZERS = GOLDEN / "tokenizers"
RECORDED = json.loads((TOKENIZERS / "recorded.json").read_text())
HF = {"type": "HuggingFaceTokenizer", "model": str(GOLDEN / "hf_tokenizer")}


def write_config(folder: Path, path: str, tokenizer: dict, **extra) -> Path:
    config = {"datasets": [{"path": path, **extra.pop("dataset", {})}], "split": "90,5,5",
              "sequence_length": 128, "tokenizer": tokenizer, "cache_dir": "cache",
              "training": {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8}, **extra}
    file = folder / f"{Path(path).name.split('.')[0]}.yaml"
    file.write_text(yaml.safe_dump(config, sort_keys=False))
    return file


def tokenized(folder: Path) -> list[Path]:
    return sorted((folder / "cache" / "text").glob("*_document.idx"))


def pair_bytes(prefix: Path) -> tuple[bytes, bytes]:
    return prefix.with_suffix(".bin").read_bytes(), prefix.with_suffix(".idx").read_bytes()


def digests(prefix: Path) -> tuple[str, str]:
    return tuple(hashlib.sha256(b).hexdigest() for b in pair_bytes(prefix))


def sample_files(mount: Path) -> dict[str, bytes]:
    return {f"{split}/{p.name}": p.read_bytes() for split in ("train", "valid", "test")
            for p in sorted((mount / split / "samples").iterdir())}


def test_a_jsonl_dataset_mounts_megatrons_preprocessed_samples(tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    shutil.copy(CORPUS, text / "corpus.jsonl")
    from_text = write_config(text, "corpus.jsonl", HF)
    indexed = tmp_path / "indexed"
    indexed.mkdir()
    for ext in (".bin", ".idx"):  # Megatron's own tools/preprocess_data.py output of corpus.jsonl
        shutil.copy(GOLDEN / f"hf_text_document{ext}", indexed / f"hf_text_document{ext}")
    from_megatron = write_config(indexed, "hf_text_document", HF)
    with mounted(from_text, tmp_path / "a") as a, mounted(from_megatron, tmp_path / "b") as b:
        samples = sample_files(a.path)
        assert len(samples) > 100 and samples == sample_files(b.path)
        ma, mb = (json.loads((m.path / "mmfs.json").read_text()) for m in (a, b))
        assert ma["eod_id"] == mb["eod_id"] == 0 and ma["pad_id"] == mb["pad_id"]
    [prefix] = tokenized(text)
    assert pair_bytes(prefix.with_suffix("")) == pair_bytes(GOLDEN / "hf_text_document")


def test_the_tokenized_text_is_reused_and_a_changed_file_is_tokenized_again(tmp_path):
    shutil.copy(CORPUS, tmp_path / "corpus.jsonl")
    config = write_config(tmp_path, "corpus.jsonl", HF)
    first = mmfs("build", config)
    assert first.returncode == 0 and "tokenizing" in first.stderr, first.stderr
    [output] = tokenized(tmp_path)
    again = mmfs("build", config)
    assert again.returncode == 0 and "tokenizing" not in again.stderr, again.stderr
    assert "0 built, 3 from cache" in again.stderr and tokenized(tmp_path) == [output]
    st = os.stat(tmp_path / "corpus.jsonl")
    os.utime(tmp_path / "corpus.jsonl", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touch
    touched = mmfs("build", config)
    assert touched.returncode == 0 and "tokenizing" in touched.stderr, touched.stderr
    outputs = tokenized(tmp_path)
    assert len(outputs) == 2 and pair_bytes(outputs[0].with_suffix("")) == pair_bytes(outputs[1].with_suffix(""))
    # Another tokenizer is another tokenization, not the cached one.
    no_eod = write_config(tmp_path, "corpus.jsonl", {**HF, "append_eod": False})
    assert mmfs("build", no_eod).returncode == 0
    assert any(pair_bytes(p.with_suffix("")) == pair_bytes(GOLDEN / "noeod_text_document") for p in tokenized(tmp_path))


def documents() -> list[dict]:
    """The corpus's JSON objects, its lines split as Megatron's tool splits them."""
    return [json.loads(line) for line in CORPUS.read_bytes().split(b"\n") if line.strip()]


def _parquet(path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = documents()
    # Small row groups: the reader goes one row group at a time.
    pq.write_table(pa.table({"src": [r.get("src") for r in rows], "body": [r["text"] for r in rows]}), path,
                   row_group_size=500)


def _zstd(path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    path.write_bytes(zstandard.ZstdCompressor().compress(CORPUS.read_bytes()))


@pytest.mark.parametrize("name, make, key", [
    ("corpus.jsonl.gz", lambda p: p.write_bytes(gzip.compress(CORPUS.read_bytes())), None),
    ("corpus.jsonl.zst", _zstd, None),
    ("corpus.parquet", _parquet, "body"),
])
def test_compressed_jsonl_and_parquet_are_tokenized_as_megatron_does(tmp_path, name, make, key):
    make(tmp_path / name)
    config = write_config(tmp_path, name, HF, dataset={"json_key": key} if key else {})
    assert main(["-q", "build", str(config)]) == 0
    [prefix] = tokenized(tmp_path)
    assert pair_bytes(prefix.with_suffix("")) == pair_bytes(GOLDEN / "hf_text_document")
    assert prefix.name.startswith("corpus-")


def _tokenizer_block(name: str) -> dict:
    tiktoken_vocab = 1000 + RECORDED["tiktoken_ranks"]
    return {
        "GPT2BPETokenizer": {"vocab_file": str(TOKENIZERS / "gpt2-vocab.json"),
                             "merge_file": str(TOKENIZERS / "gpt2-merges.txt")},
        "SentencePieceTokenizer": {"model": str(TOKENIZERS / "sp.model")},
        "Llama2Tokenizer": {"model": str(TOKENIZERS / "sp.model")},
        "TikTokenizer": {"model": str(TOKENIZERS / "tiktoken.json"), "vocab_size": tiktoken_vocab},
        "NullTokenizer": {"vocab_size": 70000},
    }[name] | {"type": name}


@pytest.mark.parametrize("name", ["GPT2BPETokenizer", "SentencePieceTokenizer", "Llama2Tokenizer",
                                  "TikTokenizer", "NullTokenizer"])
def test_each_tokenizer_type_in_the_config_writes_megatrons_bytes(tmp_path, name):
    if name.startswith("Tik"):
        pytest.importorskip("tiktoken")
    elif name in ("SentencePieceTokenizer", "Llama2Tokenizer"):
        pytest.importorskip("sentencepiece")
    corpus = TOKENIZERS / ("null_corpus.jsonl" if name == "NullTokenizer" else "corpus.jsonl")
    shutil.copy(corpus, tmp_path / "corpus.jsonl")
    config = write_config(tmp_path, "corpus.jsonl", _tokenizer_block(name))
    assert main(["-q", "build", str(config)]) == 0
    [prefix] = tokenized(tmp_path)
    assert digests(prefix.with_suffix("")) == (RECORDED[name]["bin_sha256"], RECORDED[name]["idx_sha256"])


def test_which_text_decodes_with_the_configs_tokenizer(tmp_path):
    shutil.copy(CORPUS, tmp_path / "corpus.jsonl")
    config = write_config(tmp_path, "corpus.jsonl", HF)
    proc = mmfs("which", config, "--iteration", "2", "--text", "--json")
    assert proc.returncode == 0, proc.stderr
    texts = [d["text"] for d in documents()]
    pieces = [p for r in json.loads(proc.stdout)["ranks"] for b in r["microbatches"]
              for s in b["samples"] for p in s["pieces"]]
    assert len(pieces) >= 8
    for p in pieces:
        text = p["text"].replace("<|endoftext|>", "")
        assert text and text in texts[p["document"]], p


@pytest.mark.parametrize("dataset, tokenizer, words", [
    ({"path": "corpus.jsonl"}, {"eod": 0}, ["datasets[0].path", "give tokenizer.type"]),
    ({"path": "nope.jsonl"}, HF, ["datasets[0].path", "nope.jsonl", "not found"]),
    ({"path": "corpus.jsonl", "json_key": 3}, HF, ["datasets[0].json_key", "3"]),
    ({"path": "hf_text_document", "json_key": "text"}, HF, ["datasets[0].json_key", "for text datasets"]),
    ({"path": "corpus.jsonl"}, {"type": "BertWordPieceLowerCase"}, ["tokenizer.type", "BertWordPieceLowerCase"]),
    ({"path": "corpus.jsonl"}, {"type": "HuggingFaceTokenizer"}, ["tokenizer.model", "missing"]),
    ({"path": "corpus.jsonl"}, {"type": "GPT2BPETokenizer", "vocab_file": "v.json"}, ["tokenizer.merge_file"]),
    ({"path": "corpus.jsonl"}, {"type": "HuggingFaceTokenizer", "model": "none/"}, ["tokenizer.model", "none"]),
    ({"path": "corpus.jsonl"}, {"eod": 0, "model": "x"}, ["tokenizer.model", "needs tokenizer.type"]),
    ({"path": "corpus.jsonl"}, {**HF, "append_eod": "yes"}, ["tokenizer.append_eod"]),
    ({"path": "corpus.jsonl"}, {"type": "NullTokenizer", "vocab_size": 9, "tiktoken_pattern": "v2"},
     ["tokenizer.tiktoken_pattern"]),
])
def test_config_mistakes_are_one_line(tmp_path, dataset, tokenizer, words):
    shutil.copy(CORPUS, tmp_path / "corpus.jsonl")
    for ext in (".bin", ".idx"):
        shutil.copy(GOLDEN / f"hf_text_document{ext}", tmp_path / f"hf_text_document{ext}")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"datasets": [dataset], "sequence_length": 16, "tokenizer": tokenizer}))
    proc = mmfs("build", config)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(w in lines[0] for w in [str(config), *words]), lines[0]


def test_bad_text_is_one_line_naming_the_line_and_leaves_no_output(tmp_path):
    (tmp_path / "corpus.jsonl").write_text('{"text": "fine"}\n{"body": "no text key"}\n')
    config = write_config(tmp_path, "corpus.jsonl", HF)
    proc = mmfs("build", config)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "corpus.jsonl:2: no key 'text'" in proc.stderr.strip().splitlines()[-1]
    assert tokenized(tmp_path) == [] and not list((tmp_path / "cache" / "text").glob("*.tmp-*"))
    _parquet(tmp_path / "rows.parquet")
    config = write_config(tmp_path, "rows.parquet", HF)  # json_key defaults to "text": not a column here
    proc = mmfs("build", config)
    assert proc.returncode == 2 and "no column 'text'" in proc.stderr and "'body'" in proc.stderr, proc.stderr


def test_two_builds_at_once_tokenize_once(tmp_path):
    shutil.copy(CORPUS, tmp_path / "corpus.jsonl")
    config = write_config(tmp_path, "corpus.jsonl", HF)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    builds = [subprocess.Popen([sys.executable, "-m", "mmfs.cli", "build", str(config)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [b.communicate(timeout=300)[1] for b in builds]
    assert [b.returncode for b in builds] == [0, 0], errs
    assert sum("tokenizing" in e for e in errs) == 1, errs
    assert len(tokenized(tmp_path)) == 1 and not list((tmp_path / "cache" / "text").glob("*.lock"))


def test_megatrons_data_path_string_takes_text_files(tmp_path):
    part = b"".join(CORPUS.read_bytes().splitlines(keepends=True)[:400])  # the two files' outputs are compared
    (tmp_path / "a.jsonl").write_bytes(part)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(part))
    config = write_config(tmp_path, "a.jsonl", HF, samples={"train": 500, "valid": 20, "test": 10})
    raw = yaml.safe_load(config.read_text())
    del raw["datasets"]
    raw["data_path"] = "0.3 a.jsonl 0.7 b.jsonl.gz"
    config.write_text(yaml.safe_dump(raw))
    assert main(["-q", "build", str(config)]) == 0
    outputs = tokenized(tmp_path)
    assert [p.name.split("-")[0] for p in outputs] == ["a", "b"]
    assert pair_bytes(outputs[0].with_suffix("")) == pair_bytes(outputs[1].with_suffix(""))


def test_tokenizing_works_from_a_folder_holding_another_mmfs_package(tmp_path):
    # A source checkout with a normal install: the current folder's mmfs/ is not the
    # one running (here one that cannot even be imported); the tokenizing child must
    # import the parent's mmfs, not the folder's.
    (tmp_path / "mmfs").mkdir()
    (tmp_path / "mmfs" / "__init__.py").write_text("raise ImportError('the folder mmfs, not the running one')\n")
    shutil.copy(CORPUS, tmp_path / "corpus.jsonl")
    config = write_config(tmp_path, "corpus.jsonl", {"type": "ByteLevel"})
    root = Path(__file__).resolve().parent.parent
    run_installed = f"import sys; sys.path.insert(0, {str(root)!r}); from mmfs.cli import main; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", run_installed, "build", config.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert len(tokenized(tmp_path)) == 1


@pytest.mark.parametrize("when", ["while the child reads it", "before the child starts"])
def test_a_text_rewritten_while_it_is_tokenized_is_refused_and_nothing_kept(tmp_path, monkeypatch, capsys, when):
    # The rewrite is injected where the parent starts or waits for the tokenizing child:
    # either way the pair written is not of the text whose identity names it.
    import types

    from mmfs.megatron import tokenized as tokenized_module
    corpus = tmp_path / "corpus.jsonl"
    shutil.copy(CORPUS, corpus)

    def rewrite() -> None:
        corpus.write_text('{"text": "another text, written meanwhile"}\n' * 50)

    class Rewriting(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            if when == "before the child starts":
                rewrite()
            super().__init__(*args, **kwargs)

        def wait(self, timeout=None):
            code = super().wait(timeout)
            if when == "while the child reads it":
                rewrite()
            return code

    monkeypatch.setattr(tokenized_module, "subprocess", types.SimpleNamespace(
        Popen=Rewriting, DEVNULL=subprocess.DEVNULL, PIPE=subprocess.PIPE))
    config = write_config(tmp_path, "corpus.jsonl", {"type": "ByteLevel"})
    assert main(["-q", "build", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "corpus.jsonl: the file changed while it was tokenized" in err[0], err
    assert tokenized(tmp_path) == [] and list((tmp_path / "cache" / "text").glob("*.bin")) == []
    monkeypatch.undo()
    # Once it stays put, the new text is tokenized under a name of its own.
    assert main(["-q", "build", str(config)]) == 0
    [prefix] = tokenized(tmp_path)
    tokens = 50 * (len("another text, written meanwhile") + 1)  # byte-level, an EOD after each document
    assert prefix.with_suffix(".bin").stat().st_size == 2 * tokens  # uint16


def test_a_staged_pair_of_a_killed_run_is_removed(tmp_path):
    shutil.copy(CORPUS, tmp_path / "corpus.jsonl")
    config = write_config(tmp_path, "corpus.jsonl", {"type": "ByteLevel"})
    assert main(["-q", "build", str(config)]) == 0
    [idx] = tokenized(tmp_path)
    output_prefix = str(idx).removesuffix("_text_document.idx")
    ended = subprocess.Popen(["true"])
    ended.wait()
    running = subprocess.Popen(["sleep", "60"])
    try:
        dead, alive = (Path(f"{output_prefix}.staged-{p.pid}_text_document.bin") for p in (ended, running))
        for path in (dead, Path(f"{dead}.tmp-1"), alive):
            path.write_bytes(b"left by a tokenizing run")
        idx.unlink()
        assert main(["-q", "build", str(config)]) == 0
        assert not dead.exists() and not Path(f"{dead}.tmp-1").exists() and alive.exists()
        assert tokenized(tmp_path) == [idx]
    finally:
        running.kill()
        running.wait()
