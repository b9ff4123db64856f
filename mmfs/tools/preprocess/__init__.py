"""`mmfs preprocess`: JSONL to Megatron IndexedDatasets, byte for byte as Megatron's
tools/preprocess_data.py writes them."""

from __future__ import annotations

import argparse

from mmfs.tools.preprocess.tokenizer import TOKENIZER_TYPES


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Megatron's flags, so that a tools/preprocess_data.py command line carries over."""
    p.add_argument("--input", required=True, help="JSONL file (.jsonl, .jsonl.gz, .jsonl.zst)")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX_<key>_document.{bin,idx}")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="keys to tokenize (default: text)")
    p.add_argument("--append-eod", action="store_true", help="end each non-empty document with eod")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes (default 1)")
    p.add_argument("--tokenizer-type", required=True, choices=TOKENIZER_TYPES,
                   help="HuggingFaceTokenizer (needs mmfs[preprocess]) or ByteLevel (byte = token, eod 256)")
    p.add_argument("--tokenizer-model", help="Hugging Face tokenizer folder or tokenizer.json")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip lines that are not JSON objects with the keys, and count them")
