"""Record megatron-core 0.19.2's GPTDataset.__getitem__ on a uint16 dataset whose EOD
is 65535 and whose tokenizer has no pad (Megatron pads with -1, which a uint16 mount
writes as 65535), with the last validation sample padded. Writes, beside this file:

    pad_eod65535/data.{bin,idx}          the dataset (Megatron's IndexedDatasetBuilder)
    pad_eod65535/getitem-e<E>.npz        <split>.<variant>.<field> for every sample
    pad_eod65535/cases.json              the configs (E = add_extra_token_to_sequence)

Run with a Python that has torch 2.13.0 (CPU) and megatron-core 0.19.2:
    python tests/reference/record_megatron_getitem_pad.py
Each item is read from a fresh dataset object (see mmfs/loader.py on Megatron's
cached loss mask).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

OUT = Path(__file__).resolve().parent / "pad_eod65535"
EOD = 65535
VARIANTS = {
    "plain": {},
    "masks": {"eod_mask_loss": True, "reset_position_ids": True, "reset_attention_mask": True,
              "create_attention_mask": True},
    "docmask": {"inter_document_masking": True},
}


class Tokenizer:
    """What GPTDataset asks of a tokenizer: eod, no pad, a vocab size, identifiers."""

    eod = EOD
    vocab_size = 65536
    unique_identifiers = {"class": "test-tokenizer", "eod_id": str(EOD)}

    @property
    def pad(self):
        raise AttributeError("no pad")  # Megatron then pads with -1


def write_dataset(prefix: Path) -> None:
    rng = np.random.RandomState(65535)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for d in range(80):
        n = int(rng.randint(1, 60))
        tokens = rng.randint(0, 65535, size=n).astype(np.int64)
        tokens[rng.rand(n) < 0.05] = 65534
        if d % 7 != 3:
            tokens[-1] = EOD  # most documents end with the EOD, as --append-eod does
        builder.add_item(torch.from_numpy(tokens))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    write_dataset(OUT / "data")
    cases = {}
    for extra in (1, 0):
        arrays = {}
        for variant, flags in VARIANTS.items():
            with tempfile.TemporaryDirectory() as cache:
                def build(flags=flags, extra=extra, cache=cache):
                    all_flags = {"reset_position_ids": False, "reset_attention_mask": False,
                                 "eod_mask_loss": False, "create_attention_mask": False, **flags}
                    config = GPTDatasetConfig(
                        random_seed=99, sequence_length=32, blend=([str(OUT / "data")], None), split="80,20,0",
                        path_to_cache=cache, tokenizer=Tokenizer(), add_extra_token_to_sequence=bool(extra),
                        drop_last_partial_validation_sequence=False, **all_flags)
                    return BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True,
                                                         config).build()

                first = build()
                for split, ds in zip(("train", "valid"), first[:2]):
                    fields: dict[str, list] = {}
                    for i in range(len(ds)):
                        item = build()[("train", "valid").index(split)][i]  # a fresh dataset object
                        for k, v in item.items():
                            fields.setdefault(k, []).append(v.numpy())
                    arrays[f"{split}.{variant}.ids"] = np.arange(len(ds), dtype=np.int64)
                    for k, v in fields.items():
                        arrays[f"{split}.{variant}.{k}"] = np.stack(v)
        np.savez_compressed(OUT / f"getitem-e{extra}.npz", **arrays)
        cases[f"e{extra}"] = {"seed": 99, "sequence_length": 32, "split": "80,20,0", "eod": EOD, "pad": None,
                              "add_extra_token_to_sequence": bool(extra),
                              "drop_last_partial_validation_sequence": False}
    (OUT / "cases.json").write_text(json.dumps(cases, indent=1) + "\n")
    print("wrote", sorted(p.name for p in OUT.iterdir()))


if __name__ == "__main__":
    main()
