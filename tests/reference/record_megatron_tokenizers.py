"""Record Megatron's preprocessing output for each tokenizer type (tests/golden/preprocess/tokenizers).

Makes small tokenizer models from the preprocess corpus (a GPT-2 vocab.json/merges.txt
BPE trained with `tokenizers`, a SentencePiece BPE model, a TikToken rank file in
Megatron's JSON format), then tokenizes the first documents of the corpus with
megatron-core's own tokenizer classes (megatron/core/tokenizers/text/libraries) and
writes them with its IndexedDatasetBuilder, as tools/preprocess_data.py does with
--append-eod. Records the sha256 of each .bin and .idx and the first ids.

megatron-core's package __init__ imports its training stack (triton and more), so this
loads the tokenizer and indexed_dataset modules themselves, with the package folders
registered without running their __init__ files.

Run: PYTHONPATH=<Megatron-LM checkout> python record_megatron_tokenizers.py OUT_FOLDER
(with torch, numpy, transformers, tokenizers, sentencepiece and tiktoken installed).
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "golden", "preprocess", "corpus.jsonl")
DOCUMENTS = 800  # the first documents of the corpus, plus the edge cases below
EDGE = ["", " ", "a  b   c", "<|endoftext|> inside", "</s> and <s> and <SPECIAL_9>",
        "\u00e9\u00e8 \U0001F600 \u4e2d\u6587", "line\r\nbreaks\rand\ttabs", "  leading and trailing  "]


def _register_packages(root: str) -> None:
    """megatron, megatron.core, ... as empty packages over the checkout's folders."""
    for name in ("megatron", "megatron.core", "megatron.core.tokenizers", "megatron.core.tokenizers.text",
                 "megatron.core.tokenizers.text.libraries", "megatron.core.datasets"):
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = module
    utils = types.ModuleType("megatron.core.utils")  # only log_single_rank is used on these paths
    utils.log_single_rank = lambda logger, level, msg, *a, **k: logger.log(level, msg)
    sys.modules["megatron.core.utils"] = utils
    storage = types.ModuleType("megatron.core.datasets.object_storage_utils")
    storage.__getattr__ = lambda name: None  # object storage is not used on local files
    sys.modules["megatron.core.datasets.object_storage_utils"] = storage


def corpus() -> list[str]:
    with open(CORPUS, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(DOCUMENTS), f)]
    return texts + EDGE


def make_models(out: str, texts: list[str]) -> dict:
    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    model = json.loads(bpe.to_str())["model"]
    with open(os.path.join(out, "gpt2-vocab.json"), "w", encoding="utf-8") as f:
        json.dump(model["vocab"], f, ensure_ascii=False)  # no <|endoftext|>: the tokenizer adds it
    with open(os.path.join(out, "gpt2-merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(" ".join(m) + "\n" for m in model["merges"]))

    spm.SentencePieceTrainer.train(sentence_iterator=iter(t for t in texts if t.strip()),
                                   model_prefix=os.path.join(out, "sp"), vocab_size=800, model_type="bpe",
                                   byte_fallback=True, character_coverage=1.0, num_threads=1,
                                   minloglevel=2, pad_id=3)

    # A rank file: the 256 bytes, then the BPE's merged tokens in merge order, as bytes.
    byte_of = {ch: bytes([b]) for ch, b in zip(_byte_chars(), range(256))}
    merged = [tok for tok, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if len(tok) > 1]
    tokens = [bytes([i]) for i in range(256)] + [b"".join(byte_of[c] for c in tok) for tok in merged]
    with open(os.path.join(out, "tiktoken.json"), "w") as f:
        json.dump([{"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": t.decode("utf-8", "replace")}
                   for i, t in enumerate(tokens)], f)
    return {"tiktoken_ranks": len(tokens)}


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table, byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def megatron_tokenizers(out: str, ranks: int) -> dict:
    libs = "megatron.core.tokenizers.text.libraries."
    sp = importlib.import_module(libs + "sentencepiece_tokenizer").SentencePieceTokenizer
    tt = importlib.import_module(libs + "tiktoken_tokenizer").TikTokenTokenizer
    null = importlib.import_module(libs + "null_tokenizer").NullTokenizer
    hf = importlib.import_module(libs + "megatron_hf_tokenizer").MegatronHFTokenizer
    model = os.path.join(out, "sp.model")
    # build_tokenizer's keyword arguments with Megatron's default flags.
    sp_kwargs = dict(chat_template=None, ignore_extra_whitespaces=True, legacy=False, special_tokens=None)
    return {
        "GPT2BPETokenizer": lambda: hf("GPT2BPETokenizer", os.path.join(out, "gpt2-vocab.json"),
                                       os.path.join(out, "gpt2-merges.txt"), additional_special_tokens=[],
                                       use_fast=True, trust_remote_code=False, include_special_tokens=True,
                                       use_gigatoken=False),
        "SentencePieceTokenizer": lambda: sp(model, **sp_kwargs),
        "GPTSentencePieceTokenizer": lambda: sp(model, **sp_kwargs),
        "Llama2Tokenizer": lambda: sp(model, **sp_kwargs),
        "TikTokenizer": lambda: tt(os.path.join(out, "tiktoken.json"), chat_template=None, pattern="v2",
                                   vocab_size=1000 + ranks, num_special_tokens=1000, special_tokens=None),
        "TikTokenizer-v1": lambda: tt(os.path.join(out, "tiktoken.json"), chat_template=None, pattern="v1",
                                      vocab_size=1000 + ranks, num_special_tokens=1000, special_tokens=None),
        "NullTokenizer": lambda: null(70000),
    }


def write(builder_class, dtype_of, tokenizer, texts: list[str], prefix: str) -> dict:
    """tools/preprocess_data.py's Encoder.encode and builder calls, one text key, --append-eod."""
    builder = builder_class(prefix + ".bin", dtype=dtype_of(tokenizer.vocab_size))
    first = []
    for text in texts:
        ids = tokenizer.text_to_ids(text)
        lens = [len(ids)] if ids else []
        if ids:
            ids = ids + [tokenizer.eod]
            lens[-1] += 1
        builder.add_document(ids, lens)
        if len(first) < 3:
            first.append(ids[:12])
    builder.finalize(prefix + ".idx")
    digest = {ext: hashlib.sha256(open(prefix + ext, "rb").read()).hexdigest() for ext in (".bin", ".idx")}
    return {"vocab_size": tokenizer.vocab_size, "eod": tokenizer.eod, "bin_sha256": digest[".bin"],
            "idx_sha256": digest[".idx"], "first_ids": first}


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    out = os.path.abspath(sys.argv[1])
    root = os.path.dirname(importlib.util.find_spec("megatron").submodule_search_locations[0]) \
        if importlib.util.find_spec("megatron") else None
    _register_packages(os.path.join(root, ""))
    texts = corpus()
    info = make_models(out, texts)
    with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
    null_texts = [" ".join(str((i * 7919 + j * 104729) % 70000) for j in range(1 + i % 50)) for i in range(300)]
    with open(os.path.join(out, "null_corpus.jsonl"), "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in null_texts)
    indexed = importlib.import_module("megatron.core.datasets.indexed_dataset")
    # MegatronHFTokenizer resolves "gpt2" through AutoTokenizer: a local folder of that name
    # (model type only, no tokenizer.json) makes it build GPT-2's tokenizer from our files.
    os.makedirs(os.path.join(out, "work", "gpt2"), exist_ok=True)
    with open(os.path.join(out, "work", "gpt2", "config.json"), "w") as f:
        json.dump({"model_type": "gpt2"}, f)
    with open(os.path.join(out, "work", "gpt2", "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 1024}, f)
    os.chdir(os.path.join(out, "work"))
    results = {}
    for name, make in megatron_tokenizers(out, info["tiktoken_ranks"]).items():
        tokenizer = make()
        corpus_texts = null_texts if name == "NullTokenizer" else texts
        results[name] = write(indexed.IndexedDatasetBuilder, indexed.DType.optimal_dtype, tokenizer,
                              corpus_texts, os.path.join(out, "work", name))
        print(name, results[name]["vocab_size"], results[name]["eod"], results[name]["first_ids"][0][:6], flush=True)
    results["tiktoken_ranks"] = info["tiktoken_ranks"]
    with open(os.path.join(out, "recorded.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
