"""SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer as megatron-core
0.19.2 builds them for preprocessing: all three are its SentencePieceTokenizer with the
default arguments (not legacy, extra whitespace ignored), so ids are
`SentencePieceProcessor.encode_as_ids(text)` (no BOS, no EOS), eod is the model's eos id
and the vocabulary is the model's piece count."""

from __future__ import annotations

import numpy as np

from mmfs.errors import PreprocessError
from mmfs.text.tokenizer_base import Tokenizer, check_tokenizer_file, flatten


class SentencePieceTokenizer(Tokenizer):
    def __init__(self, path: str) -> None:
        try:
            import sentencepiece
        except ImportError:
            raise PreprocessError("SentencePiece tokenizers need the `sentencepiece` package: "
                                  "pip install 'mmfs[sentencepiece]'") from None
        check_tokenizer_file(path, "SentencePiece tokenizer.model")
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.Load(path)
        except (OSError, RuntimeError) as exc:
            raise PreprocessError(f"{path}: cannot load the SentencePiece model ({str(exc).splitlines()[0]}); "
                                  "--tokenizer-model takes a tokenizer.model file") from None
        self._sp = processor
        self.name = path
        self.vocab_size = processor.get_piece_size()
        eos = processor.eos_id()
        self.eod = eos if eos >= 0 else None  # -1: the model was trained without eos
        self.pad = processor.pad_id() if processor.pad_id() >= 0 else None
        self.max_id = self.vocab_size - 1

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return flatten(self._sp.encode_as_ids(texts))

    def decode(self, ids: list[int]) -> str:
        return self._sp.decode_ids(ids)
