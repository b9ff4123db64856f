"""Megatron's tools/preprocess_data.py hot path, for a same-run comparison where the
tool itself cannot run (it needs Megatron-LM's checkout and, through
megatron.training, Python >= 3.12).

Run with a Python that has megatron-core and transformers. It does what the tool does
per document, with megatron-core's own classes: a multiprocessing.Pool of `workers`
processes, `imap(encode, lines, 32)`, `json.loads`, megatron-core's
HuggingFaceTokenizer `tokenize` per text, `--append-eod`, and megatron-core's
IndexedDatasetBuilder `add_document` / `finalize` in the parent.

    python benchmarks/megatron_baseline.py INPUT TOKENIZER_DIR OUTPUT_PREFIX WORKERS
"""

import json
import multiprocessing
import sys

_tokenizer = None


def _init(path: str) -> None:
    global _tokenizer
    from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import HuggingFaceTokenizer

    _tokenizer = HuggingFaceTokenizer(path)


def _encode(line: str):
    ids = _tokenizer.text_to_ids(json.loads(line)["text"])
    lens = [len(ids)] if ids else []
    if ids:
        ids.append(_tokenizer.eod)
        lens[-1] += 1
    return ids, lens


def main() -> None:
    src, tokenizer_dir, prefix, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    from megatron.core.datasets import indexed_dataset

    _init(tokenizer_dir)
    builder = indexed_dataset.IndexedDatasetBuilder(
        prefix + "_text_document.bin", dtype=indexed_dataset.DType.optimal_dtype(_tokenizer.vocab_size))
    with open(src, encoding="utf-8") as fin, multiprocessing.Pool(workers, _init, (tokenizer_dir,)) as pool:
        for ids, lens in pool.imap(_encode, fin, 32):
            builder.add_document(ids, lens)
    builder.finalize(prefix + "_text_document.idx")


if __name__ == "__main__":
    main()
