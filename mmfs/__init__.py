"""mmfs: Megatron-LM training samples as a read-only FUSE file system."""

__version__ = "0.1.0"
