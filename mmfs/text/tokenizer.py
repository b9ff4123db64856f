"""Tokenizers for `mmfs preprocess`: every type Megatron's tools/preprocess_data.py takes
(HuggingFace here; GPT2BPE, SentencePiece (and its GPT and Llama2 names), TikToken in
their own modules; Null here) and a built-in byte-level one.

Both turn a batch of texts into one flat token array plus one length per text, so a
worker converts a whole chunk of documents without a Python loop per token.

megatron-core's HuggingFaceTokenizer (through transformers' AutoTokenizer) does, and
so does this module:
  - ids are `tokenizer(text).input_ids`: the tokenizer.json pipeline with its
    post-processor (special tokens such as a BOS), no truncation, no padding;
  - special tokens named in tokenizer_config.json (bos, eos, unk, sep, pad, cls, mask,
    then extra_special_tokens or additional_special_tokens) become special (matched whole in the text); those the
    vocabulary lacks are added, in that order;
  - eod is the eos token's id (the sep token's when there is no eos token);
  - vocab_size is the vocabulary with the added tokens, `len(tokenizer)`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from mmfs.errors import PreprocessError
from mmfs.text.tokenizer_base import Tokenizer, check_tokenizer_file, flatten, read_tokenizer_json

BYTE_LEVEL = "ByteLevel"
HUGGING_FACE = "HuggingFaceTokenizer"
GPT2_BPE = "GPT2BPETokenizer"
SENTENCEPIECE_TYPES = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")
TIKTOKEN = "TikTokenizer"
NULL = "NullTokenizer"
TOKENIZER_TYPES = (HUGGING_FACE, GPT2_BPE, *SENTENCEPIECE_TYPES, TIKTOKEN, NULL, BYTE_LEVEL)

# The byte-level tokenizer of `make demo` (mmfs/tools/demo.py): token = UTF-8 byte, EOD = 256.
BYTE_EOD = 256

# transformers' order of the named special tokens (SPECIAL_TOKENS_ATTRIBUTES).
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class TokenizerSpec:
    """What a worker needs to load the tokenizer itself (small and picklable): Megatron's
    --tokenizer-type, --tokenizer-model, --vocab-file, --merge-file, --vocab-size and
    --tiktoken-pattern."""

    kind: str
    path: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    vocab_size: int | None = None
    tiktoken_pattern: str | None = None

    def missing(self) -> list[str]:
        """The fields this type needs that are not given."""
        needs = {GPT2_BPE: ("vocab_file", "merge_file"), NULL: ("vocab_size",), BYTE_LEVEL: ()}.get(
            self.kind, ("path",))
        return [name for name in needs if getattr(self, name) is None]

    def load(self) -> Tokenizer:
        if self.kind == BYTE_LEVEL:
            return ByteLevelTokenizer()
        if self.kind == NULL:
            return NullTokenizer(self.vocab_size or 0)
        if self.kind == GPT2_BPE:
            from mmfs.text.tokenizer_gpt2 import GPT2BPETokenizer
            return GPT2BPETokenizer(self.vocab_file or "", self.merge_file or "")
        if self.kind in SENTENCEPIECE_TYPES:
            from mmfs.text.tokenizer_sentencepiece import SentencePieceTokenizer
            return SentencePieceTokenizer(self.path or "")
        if self.kind == TIKTOKEN:
            from mmfs.text.tokenizer_tiktoken import TikTokenizer
            return TikTokenizer(self.path or "", self.vocab_size, self.tiktoken_pattern)
        return HuggingFaceTokenizer(self.path or "")


def eod_and_pad(spec: TokenizerSpec) -> tuple[int | None, int | None]:
    """The eod and pad ids Megatron's tokenizer of this spec gives (None: it has none)."""
    tokenizer = spec.load()
    return tokenizer.eod, tokenizer.pad


class NullTokenizer(Tokenizer):
    """megatron-core's NullTokenizer: a text is ids separated by single spaces (Python's
    int() of each part), eod is vocab_size - 1, no pad."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 1:
            raise PreprocessError("NullTokenizer needs --vocab-size (1 or more)")
        self.name = f"null (vocabulary {vocab_size})"
        self.vocab_size = vocab_size
        self.eod = vocab_size - 1
        self.max_id = vocab_size - 1

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = [[int(part) for part in text.split(" ")] for text in texts]
        tokens, lengths = flatten(ids)
        if tokens.size and (tokens.min() < 0 or tokens.max() > self.max_id):
            raise ValueError(f"id {tokens.min() if tokens.min() < 0 else tokens.max()} is outside the "
                             f"vocabulary of {self.vocab_size}")
        return tokens, lengths

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


class ByteLevelTokenizer(Tokenizer):
    """Token = byte of the text's UTF-8 encoding; EOD = 256; vocabulary 257."""

    name = "byte-level"
    vocab_size = BYTE_EOD + 1
    eod = BYTE_EOD
    max_id = BYTE_EOD

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        data = [t.encode("utf-8") for t in texts]
        lengths = np.fromiter(map(len, data), dtype=np.int64, count=len(data))
        return np.frombuffer(b"".join(data), dtype=np.uint8).astype(np.int64), lengths

    def decode(self, ids: list[int]) -> str:
        """Runs of bytes as UTF-8; eod as <|eod|>, any other id above a byte as <|id|>."""
        parts, run = [], []
        for t in ids:
            if t < 256:
                run.append(t)
                continue
            parts.append(bytes(run).decode("utf-8", errors="replace"))
            run = []
            parts.append("<|eod|>" if t == BYTE_EOD else f"<|{t}|>")
        parts.append(bytes(run).decode("utf-8", errors="replace"))
        return "".join(parts)


def _special_token(value, added_token_class):
    """A special token as tokenizer_config.json writes it (a string, or a dict with its
    "content") as a special AddedToken; None if there is none. The dict's lstrip/rstrip
    flags are not applied: transformers 5 does not apply them either."""
    if isinstance(value, dict):
        value = value.get("content")
    return added_token_class(value, special=True, normalized=False) if isinstance(value, str) else None


def _locate(path: str) -> tuple[str, str | None]:
    """(tokenizer.json, tokenizer_config.json or None) for a folder or a tokenizer.json."""
    if os.path.isdir(path):
        folder, file = path, os.path.join(path, "tokenizer.json")
    else:
        folder, file = os.path.dirname(path) or ".", path
    if not os.path.lexists(file):
        raise PreprocessError(
            f"{path}: no tokenizer.json there; --tokenizer-model takes a Hugging Face tokenizer "
            "folder (with tokenizer.json) or a tokenizer.json file")
    check_tokenizer_file(file, "tokenizer.json")
    config = os.path.join(folder, "tokenizer_config.json")
    return file, check_tokenizer_file(config, "tokenizer_config.json") if os.path.lexists(config) else None


def _read_config(path: str | None) -> dict:
    if path is None:
        return {}
    return read_tokenizer_json(path, "tokenizer config", dict, "fix or remove it")


class HuggingFaceTokenizer(Tokenizer):
    """A Hugging Face tokenizer folder or tokenizer.json, read with `tokenizers`."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import AddedToken
            from tokenizers import Tokenizer as RustTokenizer
        except ImportError:
            raise PreprocessError(
                "HuggingFaceTokenizer needs the `tokenizers` package: pip install 'mmfs[preprocess]' "
                "(or use --tokenizer-type ByteLevel)") from None
        file, config_path = _locate(path)
        config = _read_config(config_path)
        try:
            tok = RustTokenizer.from_file(file)
        except Exception as exc:  # the Rust loader raises plain Exception
            raise PreprocessError(f"{file}: cannot load the tokenizer ({str(exc).splitlines()[0]})") from None
        # transformers encodes with no truncation and no padding, whatever tokenizer.json says.
        tok.no_truncation()
        tok.no_padding()
        specials = {name: _special_token(config.get(name), AddedToken) for name in _SPECIAL_NAMES}
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        extra = list(extra) if isinstance(extra, (list, dict)) else []  # a dict: its keys (transformers 5)
        wanted = [specials[name] for name in _SPECIAL_NAMES] + [_special_token(t, AddedToken) for t in extra]
        # Added as special even when in the vocabulary: transformers then matches them
        # whole in the text; only the missing ones grow the vocabulary.
        tok.add_special_tokens([t for t in wanted if t is not None])
        eos = specials["eos_token"] if specials["eos_token"] is not None else specials["sep_token"]
        self._tok = tok
        self.name = path
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.eod = tok.token_to_id(eos.content) if eos is not None else None
        pad = specials["pad_token"]
        self.pad = tok.token_to_id(pad.content) if pad is not None else None
        self.max_id = max(tok.get_vocab(with_added_tokens=True).values(), default=0)
        self._encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return flatten([e.ids for e in self._encode(texts, add_special_tokens=True)])

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)
