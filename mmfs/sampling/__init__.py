"""Megatron's sample indices (GPTDataset, BlendedDataset) and readers of samples."""

from .corpus import Corpus, DatasetEntry, open_corpus

__all__ = ["Corpus", "DatasetEntry", "open_corpus"]
