"""`mmfs preprocess` with each tokenizer type of Megatron's preprocessing, against outputs
recorded from megatron-core's own tokenizer classes and IndexedDatasetBuilder
(tests/reference/record_megatron_tokenizers.py), and Megatron's other flags."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmfs.cli import main
from mmfs.text.tokenizer import TokenizerSpec, eod_and_pad

HERE = Path(__file__).parent / "golden" / "preprocess" / "tokenizers"
RECORDED = json.loads((HERE / "recorded.json").read_text())
TIKTOKEN_VOCAB = str(1000 + RECORDED["tiktoken_ranks"])
SP = ["--tokenizer-model", HERE / "sp.model"]
FLAGS = {
    "GPT2BPETokenizer": ["--vocab-file", HERE / "gpt2-vocab.json", "--merge-file", HERE / "gpt2-merges.txt"],
    "SentencePieceTokenizer": SP,
    "GPTSentencePieceTokenizer": SP,
    "Llama2Tokenizer": SP,
    "TikTokenizer": ["--tokenizer-model", HERE / "tiktoken.json", "--vocab-size", TIKTOKEN_VOCAB],
    "TikTokenizer-v1": ["--tokenizer-model", HERE / "tiktoken.json", "--vocab-size", TIKTOKEN_VOCAB,
                        "--tiktoken-pattern", "v1"],
    "NullTokenizer": ["--vocab-size", "70000"],
}


def run(name: str, prefix: Path, *extra) -> int:
    corpus = HERE / ("null_corpus.jsonl" if name == "NullTokenizer" else "corpus.jsonl")
    return main(["-q", "preprocess", "--input", str(corpus), "--output-prefix", str(prefix),
                 "--tokenizer-type", name.removesuffix("-v1"), *map(str, FLAGS[name]), "--append-eod",
                 *map(str, extra)])


def digests(prefix: Path) -> tuple[str, str]:
    return tuple(hashlib.sha256(Path(f"{prefix}_text_document{ext}").read_bytes()).hexdigest()
                 for ext in (".bin", ".idx"))


@pytest.mark.parametrize("name", list(FLAGS))
def test_byte_identical_to_megatrons_class(tmp_path, name):
    if name.startswith("Tik"):
        pytest.importorskip("tiktoken")
    elif "SentencePiece" in name or name.startswith("Llama"):
        pytest.importorskip("sentencepiece")
    assert run(name, tmp_path / "out", "--workers", 2) == 0
    assert digests(tmp_path / "out") == (RECORDED[name]["bin_sha256"], RECORDED[name]["idx_sha256"])


def test_partitions_with_sequential_samples_equal_one_partition(tmp_path):
    pytest.importorskip("sentencepiece")
    assert run("Llama2Tokenizer", tmp_path / "one") == 0
    assert run("Llama2Tokenizer", tmp_path / "three", "--partitions", 3, "--keep-sequential-samples",
               "--keep-newlines", "--log-interval", 100) == 0
    assert digests(tmp_path / "one") == digests(tmp_path / "three")


@pytest.mark.parametrize("flags, expected", [
    (["--partitions", "3"], "--partitions 3: without --keep-sequential-samples"),
    (["--split-sentences"], "--split-sentences: mmfs preprocess does not split sentences"),
    (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v.json"], "GPT2BPETokenizer needs --merge-file"),
    (["--tokenizer-type", "NullTokenizer"], "NullTokenizer needs --vocab-size"),
    (["--tokenizer-type", "TikTokenizer"], "TikTokenizer needs --tokenizer-model"),
    (["--tokenizer-type", "TikTokenizer", "--tokenizer-model", HERE / "tiktoken.json", "--vocab-size", "999999"],
     "fewer than --vocab-size minus 1000"),
    (["--tokenizer-type", "ByteLevel", "--tiktoken-pattern", "v1"], "--tiktoken-pattern is for TikTokenizer"),
])
def test_unhonourable_flags_are_one_line(tmp_path, capsys, flags, expected):
    if "TikTokenizer" in flags and "--vocab-size" in flags:
        pytest.importorskip("tiktoken")
    if "--tokenizer-type" not in flags:
        flags = ["--tokenizer-type", "ByteLevel", *flags]
    args = ["-q", "preprocess", "--input", str(HERE / "corpus.jsonl"), "--output-prefix", str(tmp_path / "o"),
            *map(str, flags)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


def test_null_tokenizer_names_a_bad_line(tmp_path, capsys):
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "1 2"}\n{"text": "1  2"}\n')
    assert main(["-q", "preprocess", "--input", str(jsonl), "--output-prefix", str(tmp_path / "o"),
                 "--tokenizer-type", "NullTokenizer", "--vocab-size", "10"]) == 2
    assert "in.jsonl:2: the tokenizer cannot encode" in capsys.readouterr().err


def test_eod_and_pad_as_megatron_gives_them():
    pytest.importorskip("sentencepiece")
    pytest.importorskip("tiktoken")
    assert eod_and_pad(TokenizerSpec("NullTokenizer", vocab_size=70000)) == (69999, None)
    assert eod_and_pad(TokenizerSpec("TikTokenizer", str(HERE / "tiktoken.json"), vocab_size=1300)) == (2, 4)
    # the SentencePiece model was trained with pad_id=3 (its eos is 2, as recorded)
    llama = TokenizerSpec("Llama2Tokenizer", str(HERE / "sp.model"))
    assert eod_and_pad(llama) == (RECORDED["Llama2Tokenizer"]["eod"], 3)
    gpt2 = TokenizerSpec("GPT2BPETokenizer", vocab_file=str(HERE / "gpt2-vocab.json"),
                         merge_file=str(HERE / "gpt2-merges.txt"))
    assert eod_and_pad(gpt2) == (RECORDED["GPT2BPETokenizer"]["eod"], None)


def test_log_interval_prints_progress_lines_without_a_terminal(tmp_path):
    def progress_lines(*extra: str) -> int:
        proc = subprocess.run([sys.executable, "-m", "mmfs.cli", "preprocess", "--input", str(HERE / "corpus.jsonl"),
                               "--output-prefix", str(tmp_path / "o"), "--tokenizer-type", "ByteLevel", *extra],
                              capture_output=True, text=True, check=True)
        return sum("documents/s" in line and "wrote" not in line for line in proc.stderr.splitlines())

    # one closing summary line without the flag; at least one more with it
    assert progress_lines() == 1
    assert progress_lines("--log-interval", "100") >= 2
