"""Adapters from a mount to other trainers' data interfaces, each an optional import:
`mmfs.adapters.megatron` (Megatron-LM's --dataloader-type external provider; needs
numpy until it runs in Megatron), `mmfs.adapters.torch` (needs torch) and
`mmfs.adapters.grain` (grain's protocol; needs nothing). `import mmfs.loader`
imports none of them."""
