"""Building a config's indices as BlendedMegatronDatasetBuilder does: the builder, its
tasks and locks, the checks before a build, and the descriptions that name the cache files."""
