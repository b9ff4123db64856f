"""Adapters from a mount to other trainers' data interfaces, each an optional import:
`mmfs.adapters.torch` (needs torch) and `mmfs.adapters.grain` (grain's protocol;
needs nothing). `import mmfs.loader` imports neither."""
