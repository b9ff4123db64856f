"""The tokenizer: block of `mmfs config --from-megatron`: eod and pad as Megatron's
tokenizer gives them, and the identifiers megatron-core 0.19 hashes into its index
cache's file names, computed as it computes them, so that mmfs and Megatron build
and find the same cache files.

megatron-core's build_tokenizer (megatron/core/tokenizers/utils/build_tokenizer.py)
makes a text tokenizer (class DefaultTokenizerText) whose unique_identifiers are
its class, its path, then each keyword argument it was given, str() of each, in the
order build_tokenizer gives them (checked against Megatron's own, for every type:
tests/reference/record_megatron_cache_names.py).
"""

from __future__ import annotations

from typing import Any

from mmfs.config.tokenizer import DEFAULT_TOKENIZER_CLASS
from mmfs.errors import MmfsError
from mmfs.text.tokenizer import BYTE_LEVEL, TOKENIZER_TYPES, TokenizerSpec, eod_and_pad

# The tokenizer flags that go into the identifiers (their values: 0 for a switch, None for nargs='+').
FLAGS = {"--tokenizer-special-tokens": None, "--tiktoken-num-special-tokens": 1, "--chat-template": 1,
         "--tokenizer-sentencepiece-legacy": 0, "--no-tokenizer-sentencepiece-ignore-extra-whitespaces": 0,
         "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces": 0, "--tokenizer-hf-no-use-fast": 0,
         "--tokenizer-hf-no-include-special-tokens": 0, "--trust-remote-code": 0}
MEGATRON_BPE = ("GPT2BPETokenizer",)  # build_tokenizer's MEGATRON_TOKENIZERS that GPT datasets take
SENTENCEPIECE = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")


class TokenizerFlagError(MmfsError):
    """A tokenizer flag mmfs cannot honour."""


def _str_list(value: Any) -> str:
    return str(list(value) if value else [])


def identifiers(kind: str, values: dict, vocab: int | None) -> dict[str, str | None]:
    """megatron-core's tokenizer.unique_identifiers for the launch line's tokenizer flags."""
    special = values.get("--tokenizer-special-tokens")  # None: not given (Megatron's default)
    chat = values.get("--chat-template")
    ids: dict[str, str | None] = {"class": DEFAULT_TOKENIZER_CLASS}
    hf = {"use_fast": str("--tokenizer-hf-no-use-fast" not in values),
          "trust_remote_code": str("--trust-remote-code" in values),
          "include_special_tokens": str("--tokenizer-hf-no-include-special-tokens" not in values)}
    if kind in MEGATRON_BPE:
        ids["tokenizer_path"] = kind
        ids |= {"additional_special_tokens": _str_list(special), "vocab_file": str(values.get("--vocab-file")),
                "merges_file": str(values.get("--merge-file")), **hf}
    elif kind in SENTENCEPIECE:
        ids["tokenizer_path"] = values.get("--tokenizer-model")
        whitespace = not any(f in values for f in ("--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
                                                   "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces"))
        ids |= {"chat_template": str(chat), "ignore_extra_whitespaces": str(whitespace),
                "legacy": str("--tokenizer-sentencepiece-legacy" in values), "special_tokens": str(special)}
    elif kind == "TikTokenizer":
        ids["tokenizer_path"] = values.get("--tokenizer-model")
        ids["chat_template"] = str(chat)
        if values.get("--tiktoken-pattern"):
            ids["pattern"] = values["--tiktoken-pattern"]
        if vocab:
            ids["vocab_size"] = str(vocab)
        ids |= {"num_special_tokens": str(_number(values, "--tiktoken-num-special-tokens", 1000)),
                "special_tokens": str(special)}
    elif kind == "HuggingFaceTokenizer":
        ids["tokenizer_path"] = values.get("--tokenizer-model")
        ids |= {"chat_template": str(chat), "vocab_file": str(values.get("--vocab-file")),
                "merges_file": str(values.get("--merge-file")), "additional_special_tokens": _str_list(special),
                **{k: hf[k] for k in ("use_fast", "trust_remote_code", "include_special_tokens")}}
    elif kind == "NullTokenizer":
        ids["tokenizer_path"] = None
        if vocab:
            ids["vocab_size"] = str(vocab)
        if "--null-tokenizer-eod-id" in values:
            ids["eod_id"] = str(_number(values, "--null-tokenizer-eod-id", None))
        ids["pad_id"] = str(_number(values, "--null-tokenizer-pad-id", -1))  # Megatron's default: -1
    return ids


def _number(values: dict, flag: str, default: int | None) -> int | None:
    if flag not in values:
        return default
    try:
        return int(values[flag])
    except (TypeError, ValueError):
        raise TokenizerFlagError(f"{flag}: {values[flag]!r} is not an integer") from None


def _bridge_identifiers(kind: str, values: dict, vocab: int | None) -> dict[str, str | None] | None:
    """What mmfs gave a Megatron-Bridge config before (Bridge builds its tokenizer its own
    way; not recorded against Bridge's cache names): NullTokenizer's flags as given, and
    for the other types the config's default identifiers."""
    if kind != "NullTokenizer":
        return None
    ids = {"class": DEFAULT_TOKENIZER_CLASS, "tokenizer_path": None, "vocab_size": str(vocab)}
    for flag, key in (("--null-tokenizer-eod-id", "eod_id"), ("--null-tokenizer-pad-id", "pad_id")):
        if flag in values:
            ids[key] = str(_number(values, flag, None))
    return ids


def tokenizer_block(values: dict, megatron_lm: bool = True) -> dict[str, Any]:
    """The config's tokenizer: block for the launch line (--tokenizer-type given, or
    the entry script's default put in `values` before). megatron_lm: the identifiers
    megatron-core's build_tokenizer gives (else a Bridge config's, _bridge_identifiers)."""
    kind = values.get("--tokenizer-type")
    if kind is None:
        raise TokenizerFlagError("--tokenizer-type: missing (Megatron builds no tokenizer without it)")
    vocab = _number(values, "--vocab-size", None)
    ids_of = identifiers if megatron_lm else _bridge_identifiers
    if kind == "NullTokenizer":
        if vocab is None:
            raise TokenizerFlagError("--vocab-size: missing: NullTokenizer needs it")
        eod = _number(values, "--null-tokenizer-eod-id", vocab - 1)  # NullTokenizer: vocab_size - 1
        pad = _number(values, "--null-tokenizer-pad-id", -1)
        return {"eod": eod, "pad": None if pad == -1 else pad, "vocab_size": vocab,
                "unique_identifiers": ids_of(kind, values, vocab)}
    if kind not in TOKENIZER_TYPES or kind == BYTE_LEVEL:
        raise TokenizerFlagError(f"--tokenizer-type: {kind}: mmfs knows Megatron's GPT tokenizer types "
                                 f"({', '.join(t for t in TOKENIZER_TYPES if t != BYTE_LEVEL)}); write the "
                                 "tokenizer: block (eod, pad, unique_identifiers) by hand")
    if values.get("--tokenizer-special-tokens") and kind in (*SENTENCEPIECE, "TikTokenizer"):
        raise TokenizerFlagError(f"--tokenizer-special-tokens: {kind} then numbers its special tokens (eod among "
                                 "them) from that list, which mmfs does not read; write the tokenizer: block "
                                 "(eod, pad, unique_identifiers) by hand")
    if kind == "TikTokenizer" and "--tiktoken-num-special-tokens" in values \
            and _number(values, "--tiktoken-num-special-tokens", 1000) != 1000:
        raise TokenizerFlagError("--tiktoken-num-special-tokens: mmfs reads TikTokenizer's eod with Megatron's "
                                 "default 1000; write the tokenizer: block (eod, pad, unique_identifiers) by hand")
    # The tokenizer itself, as the config names it: eod and pad are read from it once
    # here, as the config would (writing them saves loading it whenever the config is read).
    block = {"type": kind, "model": values.get("--tokenizer-model"), "vocab_file": values.get("--vocab-file"),
             "merge_file": values.get("--merge-file"), "vocab_size": vocab,
             "tiktoken_pattern": values.get("--tiktoken-pattern")}
    spec = TokenizerSpec(kind, block["model"], block["vocab_file"], block["merge_file"], block["vocab_size"],
                         block["tiktoken_pattern"])
    for field in spec.missing():
        flag = "--tokenizer-model" if field == "path" else f"--{field.replace('_', '-')}"
        raise TokenizerFlagError(f"{flag}: missing: {kind} loads it")
    try:
        eod, pad = eod_and_pad(spec)
    except MmfsError as exc:
        flag = "--vocab-file" if spec.vocab_file else "--tokenizer-model"
        raise TokenizerFlagError(f"{flag}: {exc}") from None
    if eod is None:
        raise TokenizerFlagError(f"--tokenizer-type: {kind}: the tokenizer has no end-of-document token for "
                                 "Megatron's eod")
    ids = ids_of(kind, values, vocab)
    return {k: v for k, v in block.items() if v is not None} | {"eod": eod, "pad": pad} | (
        {} if ids is None else {"unique_identifiers": ids})
