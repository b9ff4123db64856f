"""GPT2BPETokenizer as megatron-core 0.19.2 builds it (transformers' GPT-2 tokenizer over
--vocab-file and --merge-file): a byte-level BPE with GPT-2's split pattern and no
prefix space, "<|endoftext|>" a special token (matched whole in the text, added after
the vocabulary when the vocabulary lacks it) and the eod; no BOS, no pad. Built here
with the `tokenizers` package from the same two files."""

from __future__ import annotations

import numpy as np

from mmfs.errors import PreprocessError
from mmfs.text.tokenizer_base import Tokenizer, check_tokenizer_file, flatten, read_tokenizer_json

ENDOFTEXT = "<|endoftext|>"


def _read_vocab(path: str) -> dict[str, int]:
    hint = "--vocab-file takes GPT-2's vocab.json"
    vocab = read_tokenizer_json(path, "vocab.json", dict, hint)
    if not all(isinstance(v, int) and v >= 0 for v in vocab.values()):
        raise PreprocessError(f"{path}: not a JSON object of token -> id; {hint}")
    return vocab


def _read_merges(path: str) -> list[tuple[str, str]]:
    check_tokenizer_file(path, "merges.txt")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise PreprocessError(f"{path}: cannot read the merges ({exc}); --merge-file takes GPT-2's "
                              "merges.txt") from None
    merges = []
    for number, line in enumerate(lines, 1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise PreprocessError(f"{path}:{number}: a merge is two tokens separated by one space")
        merges.append((parts[0], parts[1]))
    return merges


class GPT2BPETokenizer(Tokenizer):
    def __init__(self, vocab_file: str, merge_file: str) -> None:
        try:
            from tokenizers import AddedToken, decoders, models, pre_tokenizers
            from tokenizers import Tokenizer as RustTokenizer
        except ImportError:
            raise PreprocessError("GPT2BPETokenizer needs the `tokenizers` package: "
                                  "pip install 'mmfs[preprocess]'") from None
        vocab, merges = _read_vocab(vocab_file), _read_merges(merge_file)
        try:
            tok = RustTokenizer(models.BPE(vocab, merges))
        except Exception as exc:  # the Rust side raises plain Exception
            raise PreprocessError(f"{merge_file}: the merges do not fit {vocab_file} "
                                  f"({str(exc).splitlines()[0]})") from None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(ENDOFTEXT, special=True, normalized=False)])
        self._tok = tok
        self.name = vocab_file
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.eod = tok.token_to_id(ENDOFTEXT)
        self.pad = None
        self.max_id = max(tok.get_vocab(with_added_tokens=True).values())
        self._encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return flatten([e.ids for e in self._encode(texts, add_special_tokens=True)])

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)
