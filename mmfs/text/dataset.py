"""A text dataset of a config (a .jsonl, .jsonl.gz, .jsonl.zst or .parquet file, local
or in object storage): the IndexedDataset `mmfs preprocess` would write from it, kept
in the cache folder under a name that changes whenever the text, the tokenizer or
how it is applied changes."""

from __future__ import annotations

import hashlib
import os
import posixpath
from dataclasses import dataclass

from mmfs.storage import open_source
from mmfs.text.source import TEXT_SUFFIXES
from mmfs.text.tokenize import output_paths
from mmfs.text.tokenizer import TokenizerSpec

# Bump when the tokenized output of the same input and tokenizer would change.
TOKENIZED_FORMAT = 1


@dataclass(frozen=True)
class TextDataset:
    source: str  # the text file: a path, or a URL as written
    json_key: str  # the JSON key, or the Parquet column
    tokenizer: TokenizerSpec
    append_eod: bool
    output_prefix: str  # `mmfs preprocess --output-prefix` of the tokenized pair
    identity: tuple  # the source's identity its name was made from (the pair must hold this text)

    @property
    def prefix(self) -> str:
        """The IndexedDataset prefix of the tokenized pair (PREFIX.bin, PREFIX.idx)."""
        return output_paths(self.output_prefix, self.json_key)[0].removesuffix(".bin")


def _file_identity(path: str | None) -> tuple:
    """What changes when a tokenizer file (or each file of a tokenizer folder) does."""
    if path is None:
        return ()
    if os.path.isdir(path):
        return tuple((name, _file_identity(os.path.join(path, name)))
                     for name in sorted(os.listdir(path)) if os.path.isfile(os.path.join(path, name)))
    try:
        st = os.stat(path)
    except OSError:
        return ("missing",)
    return st.st_size, st.st_mtime_ns, st.st_ino


def tokenizer_identity(spec: TokenizerSpec) -> tuple:
    return (spec.kind, spec.vocab_size, spec.tiktoken_pattern,
            *(_file_identity(p) for p in (spec.path, spec.vocab_file, spec.merge_file)))


def text_stem(source: str) -> str:
    """A text file's name without its suffix (corpus.jsonl.gz: corpus)."""
    name = posixpath.basename(source)
    for suffix in TEXT_SUFFIXES:
        name = name.removesuffix(suffix)
    return name or "text"


def text_dataset(source: str, json_key: str, tokenizer: TokenizerSpec, append_eod: bool,
                 folder: str) -> TextDataset:
    """The text dataset of `source`, tokenized into `folder` (looks the source up:
    StorageError when it is not there)."""
    identity = open_source(source).identity
    key = repr((TOKENIZED_FORMAT, source, identity, tokenizer_identity(tokenizer), json_key, append_eod))
    tag = hashlib.sha256(key.encode()).hexdigest()[:16]
    return TextDataset(source, json_key, tokenizer, append_eod, os.path.join(folder, f"{text_stem(source)}-{tag}"),
                       identity)
