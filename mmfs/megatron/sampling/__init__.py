"""Megatron's data-parallel samplers without torch: torch.randperm, the samplers, the
compact plans of each rank's micro-batch files, and resuming on another layout."""
