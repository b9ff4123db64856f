"""The YAML config: the hardened YAML reader and the typed, checked schema."""
