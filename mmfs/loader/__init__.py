"""Read an mmfs mount from a training process: numpy only (no torch, no C core; a
config read in-process instead of a mount point brings the C core).

    m = Mount("/mnt/data")
    m.sample("train", 42)                      # tokens, in the mount's dtype
    m.megatron_item("train", 42)               # what megatron-core's GPTDataset[42] returns
    for batch in m.megatron_batches("train", rank=3, consumed_samples=4096):
        ...                                    # what Megatron's DataLoader gives rank 3
    Mount("run.yaml")                          # a config: the same files served in this
                                               # process by the C core, no FUSE (mmfs/mount/inprocess.py)

Everything comes from the files and `mmfs.json` (see README.md, "The mount"):
sample files `<split>/samples/NNNNNNN.bin`, micro-batch files
`<split>/ranks/RRR/NNNNNNN.bin` (the `training` section names their shape), and the
extended attributes `user.mmfs.pieces` (a sample's pieces) and `user.mmfs.samples`
(a micro-batch's sample ids). The arrays work as the source of a torch
Dataset / IterableDataset (torch.from_numpy) and with JAX (jnp.asarray).

`megatron_item` ports megatron-core 0.19.2's GPTDataset.__getitem__ (with
_get_ltor_masks_and_position_ids and the inter_document_masking path) to numpy,
with two facts a file of tokens does not carry by itself:
- a padded sample (the short last validation sample) holds the pad id in the
  mount's dtype, so pad -1 reads as 65535 in uint16, which is also a real token
  id there (an EOD of 65535, say). Where the two can collide (the pad does not
  survive the dtype), the sample's pieces say how many tokens are real;
- cu_seqlens counts the pieces (Megatron's per-"document" parts, which are the
  .idx sequences), read from `user.mmfs.pieces`.
Megatron caches the loss mask of a cacheable config (no eod_mask_loss, no reset_*)
and then zeroes pad positions in that very tensor, so in one Megatron process the
pad positions of the first sample it reads stay masked in later samples; mmfs
gives every sample its own mask (what Megatron gives a fresh dataset object).
"""

from __future__ import annotations

from mmfs.loader.files import COPIED_ATTRIBUTES, LoaderError
from mmfs.loader.getitem import FLAGS
from mmfs.loader.mount import Mount

__all__ = ["COPIED_ATTRIBUTES", "FLAGS", "LoaderError", "Mount"]
