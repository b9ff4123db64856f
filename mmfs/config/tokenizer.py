"""The config's `tokenizer:` block: the eod and pad ids Megatron's GPTDataset uses,
the identifiers it hashes into cache names, and optionally the tokenizer itself
(`type` and its files, as Megatron's --tokenizer-* flags name them), which text
datasets are tokenized with, which eod and pad default to, and `which --text` decodes
with."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from mmfs.config.safe_yaml import show
from mmfs.errors import PreprocessError
from mmfs.text.dataset import tokenizer_identity
from mmfs.text.tokenizer import TIKTOKEN, TOKENIZER_TYPES, TokenizerSpec

DEFAULT_TOKENIZER_CLASS = "megatron.core.tokenizers.text.models.default_tokenizer.DefaultTokenizerText"
# The tokenizer itself, as Megatron's flags name it (--tokenizer-type, --tokenizer-model,
# --vocab-file, --merge-file, --tiktoken-pattern), and --append-eod for text datasets.
TYPE_KEYS = {"type", "model", "vocab_file", "merge_file", "tiktoken_pattern", "append_eod"}
TOKENIZER_KEYS = {"eod", "pad", "vocab_size", "class", "tokenizer_path", "unique_identifiers"} | TYPE_KEYS
SPEC_KEYS = {"path": "model", "vocab_file": "vocab_file", "merge_file": "merge_file", "vocab_size": "vocab_size"}


@dataclass(frozen=True)
class TokenizerBlock:
    eod: int
    pad: int | None  # None: the tokenizer has no pad
    identifiers: dict[str, Any]  # what Megatron hashes into cache names
    spec: TokenizerSpec | None = None  # `type` and its files, when given
    append_eod: bool = True  # for text datasets


def _spec(value: dict, checker, base_dir: str, vocab: int | None) -> TokenizerSpec:
    kind = value["type"]
    if kind not in TOKENIZER_TYPES:
        raise checker.fail("tokenizer.type", f"{show(kind)} is not one of {', '.join(TOKENIZER_TYPES)}")
    files = {}
    for key in ("model", "vocab_file", "merge_file"):
        given = value.get(key)
        files[key] = None if given is None else os.path.normpath(
            os.path.join(base_dir, checker.path_text(given, f"tokenizer.{key}", "a file path")))
    pattern = value.get("tiktoken_pattern")
    if pattern is not None and (kind != TIKTOKEN or pattern not in ("v1", "v2")):
        raise checker.fail("tokenizer.tiktoken_pattern", f"{show(pattern)}: v1 or v2, for type TikTokenizer only")
    spec = TokenizerSpec(kind, files["model"], files["vocab_file"], files["merge_file"], vocab, pattern)
    for field in spec.missing():
        raise checker.fail(f"tokenizer.{SPEC_KEYS[field]}", f"missing: type {kind} needs it")
    return spec


# (spec, its files' identity) -> (eod, pad): a process reads its config more than once
# (a mount re-opens it after building), a tokenizer need not be loaded each time.
_IDS: dict[tuple, tuple[int | None, int | None]] = {}


def _from_tokenizer(spec: TokenizerSpec, checker) -> tuple[int | None, int | None]:
    """The eod and pad Megatron takes from the tokenizer (loaded only when the block
    does not give both)."""
    key = (spec, tokenizer_identity(spec))
    if key not in _IDS:
        try:
            tokenizer = spec.load()
        except PreprocessError as exc:
            field = "vocab_file" if spec.vocab_file else "vocab_size" if spec.path is None else "model"
            raise checker.fail(f"tokenizer.{field}", str(exc)) from None
        _IDS[key] = tokenizer.eod, tokenizer.pad
    return _IDS[key]


def parse_tokenizer(value: Any, checker, base_dir: str) -> TokenizerBlock:
    if value is None:
        raise checker.fail("tokenizer", "missing: Megatron needs a tokenizer; give its type and model "
                                        "(e.g. {type: HuggingFaceTokenizer, model: tokenizer/}) or at least its "
                                        "end-of-document id, e.g. {eod: 50256, pad: null}")
    if not isinstance(value, dict):
        raise checker.fail("tokenizer", "expected a mapping {eod: ID, pad: ID or null} or {type: ..., model: ...}")
    checker.unknown_keys(value, TOKENIZER_KEYS, "tokenizer.")
    int64 = " (int64, as Megatron holds token ids)"
    vocab = value.get("vocab_size")
    vocab = None if vocab is None else checker.integer(vocab, "tokenizer.vocab_size", minimum=1, why=int64)
    spec = None
    if value.get("type") is not None:
        spec = _spec(value, checker, base_dir, vocab)
    elif given := sorted(k for k in TYPE_KEYS - {"type", "append_eod"} if value.get(k) is not None):
        raise checker.fail(f"tokenizer.{given[0]}", "needs tokenizer.type (the tokenizer it belongs to)")
    eod, pad = value.get("eod"), value.get("pad")
    if spec is not None and (eod is None or "pad" not in value):
        own_eod, own_pad = _from_tokenizer(spec, checker)
        if eod is None and own_eod is None:
            raise checker.fail("tokenizer.eod", f"missing: the {spec.kind} tokenizer has no eos token; give the "
                                                "end-of-document id")
        eod = own_eod if eod is None else eod
        pad = own_pad if "pad" not in value else pad
    if eod is None:
        raise checker.fail("tokenizer.eod", "missing: the tokenizer's end-of-document token id, "
                                            "e.g. 50256 (mmfs.json gives it to loaders); or give tokenizer.type")
    eod = checker.integer(eod, "tokenizer.eod", minimum=0, why=int64)
    pad = None if pad is None else checker.integer(pad, "tokenizer.pad", minimum=-1, why=int64)
    if pad == -1:
        pad = None  # Megatron's "no pad"
    append_eod = checker.boolean(value.get("append_eod", True), "tokenizer.append_eod")
    if not isinstance(value.get("class", ""), str) or value.get("class") == "":
        raise checker.fail("tokenizer.class", f"expected a class name, got {show(value['class'])}")
    if not isinstance(value.get("tokenizer_path", ""), (str, type(None))):
        raise checker.fail("tokenizer.tokenizer_path",
                           f"expected a path or null, got {show(value['tokenizer_path'])}")
    custom = value.get("unique_identifiers")
    if custom is not None:
        if not isinstance(custom, dict):
            raise checker.fail("tokenizer.unique_identifiers", "expected a mapping")
        return TokenizerBlock(eod, pad, dict(custom), spec, append_eod)
    # What megatron-core's default text tokenizer puts into the cache description
    # (strings, as it stores them).
    identifiers = {
        "class": value.get("class", DEFAULT_TOKENIZER_CLASS),
        "tokenizer_path": value.get("tokenizer_path"),
        "vocab_size": None if vocab is None else str(vocab),
        "eod_id": str(eod),
        "pad_id": str(-1 if pad is None else pad),
    }
    return TokenizerBlock(eod, pad, identifiers, spec, append_eod)
