"""TikTokenizer as megatron-core 0.19.2 builds it: a rank file in Megatron's JSON format
(a list of {rank, token_bytes, token_str}), its ids shifted up by `num_special_tokens`
(1000) whose first seven are <unk> <s> </s> <mask> <pad> <cls> <sep> and the rest
<SPECIAL_i>; special tokens in the text are encoded as such (allowed_special="all");
eod is </s> (2), pad is <pad> (4), and the vocabulary is --vocab-size (2**17 by
default), of which the rank file must hold at least vocab_size - 1000 entries."""

from __future__ import annotations

import base64

import numpy as np

from mmfs.errors import PreprocessError
from mmfs.text.tokenizer_base import Tokenizer, flatten, read_tokenizer_json

NUM_SPECIAL_TOKENS = 1000
DEFAULT_VOCAB_SIZE = 2**17
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")
EOD = SPECIAL_TOKENS.index("</s>")
PAD = SPECIAL_TOKENS.index("<pad>")
# The split patterns Megatron names v1 and v2 (--tiktoken-pattern; v2 by default).
PATTERNS = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
          r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
          r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def special_tokens() -> list[str]:
    return list(SPECIAL_TOKENS) + [f"<SPECIAL_{i}>" for i in range(len(SPECIAL_TOKENS), NUM_SPECIAL_TOKENS)]


def _ranks(path: str, inner_vocab: int) -> dict[bytes, int]:
    """The first `inner_vocab` entries of the rank file, shifted past the special tokens."""
    entries = read_tokenizer_json(path, "TikToken rank file", list,
                                  "--tokenizer-model takes Megatron's JSON list of {rank, token_bytes, token_str}")
    if len(entries) < inner_vocab:
        raise PreprocessError(f"{path}: {len(entries)} ranks, fewer than --vocab-size minus {NUM_SPECIAL_TOKENS} "
                              f"({inner_vocab}); give --vocab-size {len(entries) + NUM_SPECIAL_TOKENS} or less")
    ranks: dict[bytes, int] = {}
    for i, entry in enumerate(entries[:inner_vocab]):
        try:
            ok = isinstance(entry, dict) and entry.get("rank") == i
            token = base64.b64decode(entry["token_bytes"], validate=True) if ok else b""
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok or (i < 256 and token != bytes([i])) or token in ranks:
            raise PreprocessError(f"{path}: entry {i} is not {{rank: {i}, token_bytes: base64}} of a new token "
                                  "(ranks 0-255 are the single bytes in order)")
        ranks[token] = i + NUM_SPECIAL_TOKENS
    return ranks


class TikTokenizer(Tokenizer):
    def __init__(self, path: str, vocab_size: int | None, pattern: str | None) -> None:
        try:
            import tiktoken
        except ImportError:
            raise PreprocessError("TikTokenizer needs the `tiktoken` package: pip install 'mmfs[tiktoken]'") from None
        vocab_size = vocab_size or DEFAULT_VOCAB_SIZE
        if vocab_size <= NUM_SPECIAL_TOKENS:
            raise PreprocessError(f"--vocab-size {vocab_size}: TikTokenizer needs more than its "
                                  f"{NUM_SPECIAL_TOKENS} special tokens")
        pattern = pattern or "v2"
        if pattern not in PATTERNS:
            raise PreprocessError(f"--tiktoken-pattern {pattern}: give v1 or v2")
        specials = {token: i for i, token in enumerate(special_tokens())}
        self._enc = tiktoken.Encoding(name="mmfs", pat_str=PATTERNS[pattern],
                                      mergeable_ranks=_ranks(path, vocab_size - NUM_SPECIAL_TOKENS),
                                      special_tokens=specials)
        self.name = path
        self.vocab_size = vocab_size
        self.eod = EOD
        self.pad = PAD
        self.max_id = vocab_size - 1

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return flatten(self._enc.encode_batch(texts, allowed_special="all"))

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids, errors="replace")
