"""Megatron's tools/preprocess_data.py hot path, for a same-run comparison where the
tool itself cannot run (it needs Megatron-LM's checkout and, through
megatron.training, Python >= 3.12).

Run with a Python that has megatron-core and transformers. It does what the tool does
per document, with megatron-core's own classes: a multiprocessing.Pool of `workers`
processes, `imap(encode, lines, 32)`, `json.loads`, megatron-core's
HuggingFaceTokenizer `tokenize` per text, `--append-eod`, and megatron-core's
IndexedDatasetBuilder `add_document` / `finalize` in the parent.

    python benchmarks/megatron_baseline.py INPUT TOKENIZER_DIR OUTPUT_PREFIX WORKERS [TYPE]

TYPE (default HuggingFaceTokenizer) picks megatron-core's class as build_tokenizer makes
it for that --tokenizer-type, over the files of tests/golden/preprocess/tokenizers
(TOKENIZER_DIR): GPT2BPETokenizer, SentencePieceTokenizer, TikTokenizer, NullTokenizer.
"""

import json
import multiprocessing
import sys

_tokenizer = None


def _init(path: str, kind: str = "HuggingFaceTokenizer") -> None:
    global _tokenizer
    import os

    from megatron.core.tokenizers.text.libraries import (
        huggingface_tokenizer,
        megatron_hf_tokenizer,
        null_tokenizer,
        sentencepiece_tokenizer,
        tiktoken_tokenizer,
    )

    files = {name: os.path.join(path, name) for name in ("gpt2-vocab.json", "gpt2-merges.txt", "sp.model",
                                                         "tiktoken.json")}
    if kind == "HuggingFaceTokenizer":
        _tokenizer = huggingface_tokenizer.HuggingFaceTokenizer(path)
    elif kind == "GPT2BPETokenizer":  # resolves "gpt2" through AutoTokenizer: run where ./gpt2 names the model type
        _tokenizer = megatron_hf_tokenizer.MegatronHFTokenizer(
            kind, files["gpt2-vocab.json"], files["gpt2-merges.txt"], additional_special_tokens=[],
            include_special_tokens=True)
    elif kind == "SentencePieceTokenizer":
        _tokenizer = sentencepiece_tokenizer.SentencePieceTokenizer(files["sp.model"], legacy=False,
                                                                     ignore_extra_whitespaces=True)
    elif kind == "TikTokenizer":
        with open(files["tiktoken.json"]) as f:
            ranks = len(json.load(f))
        _tokenizer = tiktoken_tokenizer.TikTokenTokenizer(files["tiktoken.json"], pattern="v2",
                                                          vocab_size=1000 + ranks, num_special_tokens=1000)
    else:
        _tokenizer = null_tokenizer.NullTokenizer(70000)


def _encode(line: str):
    ids = _tokenizer.text_to_ids(json.loads(line)["text"])
    lens = [len(ids)] if ids else []
    if ids:
        ids.append(_tokenizer.eod)
        lens[-1] += 1
    return ids, lens


def main() -> None:
    src, tokenizer_dir, prefix, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    kind = sys.argv[5] if len(sys.argv) > 5 else "HuggingFaceTokenizer"
    from megatron.core.datasets import indexed_dataset

    _init(tokenizer_dir, kind)
    builder = indexed_dataset.IndexedDatasetBuilder(
        prefix + "_text_document.bin", dtype=indexed_dataset.DType.optimal_dtype(_tokenizer.vocab_size))
    with open(src, encoding="utf-8") as fin, multiprocessing.Pool(workers, _init, (tokenizer_dir, kind)) as pool:
        for ids, lens in pool.imap(_encode, fin, 32):
            builder.add_document(ids, lens)
    builder.finalize(prefix + "_text_document.idx")


if __name__ == "__main__":
    main()
