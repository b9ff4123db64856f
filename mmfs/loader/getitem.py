"""megatron-core 0.19.2's GPTDataset.__getitem__ (with _get_ltor_masks_and_position_ids
and the inter_document_masking path), ported to numpy for a stack of samples read
from a mount's files (mmfs.loader.Mount reads them; this module reads nothing).

Two facts a file of tokens does not carry by itself come from its sample's pieces
(`user.mmfs.pieces`, asked for only where needed): how many tokens of a padded
sample are real where the pad does not survive the mount's dtype, and
cu_seqlens (Megatron's per-"document" parts, which are the .idx sequences).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

FLAGS = ("eod_mask_loss", "reset_position_ids", "reset_attention_mask", "create_attention_mask",
         "inter_document_masking")

PiecesOf = Callable[[int], list[tuple[int, int, int]]]  # row of the stack -> its (sequence, offset, length)


def check_flags(flags: dict) -> None:
    unknown = set(flags) - set(FLAGS)
    if unknown:
        raise TypeError(f"unknown flag {sorted(unknown)[0]!r} (flags: {', '.join(FLAGS)})")


@dataclass(frozen=True)
class SampleFields:
    """What GPTDataset.__getitem__ needs to know of a mount's samples (its mmfs.json)."""

    sequence_length: int
    add_extra_token: bool
    eod: int | None
    pad: int
    pad_in_dtype: int  # the pad as the mount's dtype holds it (-1 reads as 65535 in uint16)

    def text(self, raw: np.ndarray, pieces_of: PiecesOf) -> np.ndarray:
        """Megatron's int64 text: the tokens, with pad positions holding the pad id itself."""
        text = raw.astype(np.int64)
        if self.pad_in_dtype != self.pad:  # the pad did not survive the dtype (-1 in uint16)
            # Padding fills a sample's tail, so only a sample ending in that value may be padded.
            for row in np.flatnonzero(raw[:, -1] == self.pad_in_dtype):
                real = sum(length for _s, _o, length in pieces_of(int(row)))
                text[row, real:] = self.pad
        return text

    def items(self, raw: np.ndarray, pieces_of: PiecesOf, flags: dict[str, bool]) -> dict[str, np.ndarray]:
        """GPTDataset.__getitem__'s fields of each row of raw ([b, tokens per sample], the
        mount's dtype), stacked as torch's default collate stacks them (no dataset_id)."""
        S, pad, eod = self.sequence_length, self.pad, self.eod
        text = self.text(raw, pieces_of)
        b = text.shape[0]
        if self.add_extra_token:
            tokens, labels = text[:, :-1].copy(), text[:, 1:].copy()
        else:
            tokens, labels = text.copy(), np.roll(text, -1, axis=1)
            labels[:, -1] = pad
        is_eod = np.zeros_like(tokens, dtype=bool) if eod is None else tokens == eod
        loss_mask = np.ones((b, S), dtype=np.float32)
        if flags.get("eod_mask_loss"):
            loss_mask[is_eod] = 0.0
        positions = np.broadcast_to(np.arange(S, dtype=np.int64), (b, S))
        # Where each position's document starts: one past the last EOD before it.
        reset_pos, reset_attn = flags.get("reset_position_ids"), flags.get("reset_attention_mask")
        if reset_pos or reset_attn:
            after_eod = np.zeros((b, S), dtype=np.int64)
            after_eod[:, 1:] = np.where(is_eod[:, :-1], np.arange(1, S, dtype=np.int64), 0)
            doc_start = np.maximum.accumulate(after_eod, axis=1)
        position_ids = positions - doc_start if reset_pos else positions.copy()
        loss_mask[labels == pad] = 0.0
        tokens[tokens == pad] = 0
        labels[labels == pad] = 0
        if flags.get("inter_document_masking"):
            cu_seqlens = np.full((b, S + 1), S, dtype=np.int32)
            max_seqlen = np.empty(b, dtype=np.int32)
            position_ids = position_ids.copy()
            for row in range(b):
                cu = self.cu_seqlens([length for _s, _o, length in pieces_of(row)])
                cu_seqlens[row, :len(cu)] = cu
                max_seqlen[row] = np.diff(cu).max()
                for start, end in zip(cu[:-1], cu[1:]):
                    position_ids[row, start:end] = np.arange(end - start)
            return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids,
                    "cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen}
        if flags.get("create_attention_mask"):
            rows = np.arange(S)[:, None]
            cols = np.arange(S)[None, :]
            if reset_attn:  # attend to [start of own document, self]
                masked = (cols[None] > rows[None]) | (cols[None] < doc_start[:, :, None])
            else:
                masked = np.broadcast_to(cols > rows, (b, S, S))
            attention_mask = np.ascontiguousarray(masked)[:, None, :, :]
            return {"tokens": tokens, "labels": labels, "attention_mask": attention_mask,
                    "loss_mask": loss_mask, "position_ids": position_ids}
        return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}

    def cu_seqlens(self, lengths: list[int]) -> np.ndarray:
        """Megatron's cu_seqlens of one sample from its parts' lengths (unpadded)."""
        lengths = list(lengths)
        if self.add_extra_token and lengths:
            lengths[-1] -= 1  # the extra token belongs to the labels only
            if lengths[-1] == 0:
                lengths.pop()
        shortfall = self.sequence_length - sum(lengths)
        if shortfall > 0:  # a padded sample: the padding joins the last part
            if lengths:
                lengths[-1] += shortfall
            else:
                lengths.append(shortfall)
        return np.cumsum([0, *lengths]).astype(np.int32)
