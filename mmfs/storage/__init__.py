"""Where a dataset's bytes come from: a *source* (a local file, an in-memory buffer for
tests, an object in a bucket), chosen once from the path when a dataset is opened.

Every byte of a dataset is reached through `Source.read_into`; formats and readers
never open files themselves. See `base.py` for the interface."""
