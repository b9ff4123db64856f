"""Test helpers over the format readers."""

from __future__ import annotations

import numpy as np


def document_tokens(ds, doc: int) -> np.ndarray:
    """Every token of document `doc` (its sequences concatenated)."""
    parts = [ds.get(s) for s in ds.document_sequences(doc)]
    return np.concatenate(parts) if parts else np.zeros(0, ds.dtype)
