"""Megatron's sample indices (GPTDataset, BlendedDataset) and readers of samples."""

from mmfs.megatron.corpus import Corpus, DatasetEntry, open_corpus, open_corpus_for_serving

__all__ = ["Corpus", "DatasetEntry", "open_corpus", "open_corpus_for_serving"]
