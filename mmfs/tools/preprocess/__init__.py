"""`mmfs preprocess`: JSONL or Parquet to Megatron IndexedDatasets, byte for byte as Megatron's
tools/preprocess_data.py writes them."""

from __future__ import annotations

import argparse

from mmfs.text.tokenize import DEFAULT_MAX_LINE_BYTES
from mmfs.text.tokenizer import TOKENIZER_TYPES


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Megatron's flags, so that a tools/preprocess_data.py command line carries over."""
    p.add_argument("--input", required=True, help="JSONL file (.jsonl, .jsonl.gz, .jsonl.zst) or Parquet file "
                   "(.parquet; the keys are its columns; needs pyarrow)")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX_<key>_document.{bin,idx}")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="keys to tokenize (default: text)")
    p.add_argument("--append-eod", action="store_true", help="end each non-empty document with eod")
    p.add_argument("--workers", type=int, default=1,
                   help="tokenizer processes (default 1; at most the CPUs this process may use)")
    p.add_argument("--max-line-bytes", type=int, default=DEFAULT_MAX_LINE_BYTES,
                   help="refuse a line (one document) longer than this (default 64 MiB): "
                        "a line is held in memory whole, several times over")
    p.add_argument("--tokenizer-type", required=True, choices=TOKENIZER_TYPES,
                   help="Megatron's tokenizer types, or ByteLevel (byte = token, eod 256)")
    p.add_argument("--tokenizer-model", help="Hugging Face tokenizer folder or tokenizer.json; "
                   "SentencePiece tokenizer.model; TikToken rank file (JSON)")
    p.add_argument("--vocab-file", help="GPT2BPETokenizer: vocab.json")
    p.add_argument("--merge-file", help="GPT2BPETokenizer: merges.txt")
    p.add_argument("--vocab-size", type=int, help="NullTokenizer's vocabulary; TikTokenizer's (default 131072)")
    p.add_argument("--tiktoken-pattern", choices=("v1", "v2"), help="TikTokenizer's split pattern (default v2)")
    p.add_argument("--partitions", type=int, default=1,
                   help="as Megatron's; with --keep-sequential-samples the output equals one partition's")
    p.add_argument("--keep-sequential-samples", action="store_true",
                   help="keep the input order across partitions (mmfs always does)")
    p.add_argument("--log-interval", type=int,
                   help="print a progress line every N documents when stderr is not a terminal")
    p.add_argument("--split-sentences", action="store_true", help="not supported: refused with a message")
    p.add_argument("--keep-newlines", action="store_true",
                   help="only changes sentence splitting in Megatron's tool; accepted, no effect without it")
    p.add_argument("--lang", default="english", help="the sentence splitter's language (with --split-sentences)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip lines that are not JSON objects with the keys, and count them")
