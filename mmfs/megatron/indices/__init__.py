"""megatron-core's index maths: splits, one GPTDataset's document, sample and shuffle
indices, a blend's indices, and what a build yields (no cache, no sampling)."""
