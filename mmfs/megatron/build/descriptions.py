"""Megatron's descriptions of many GPTDatasets and their blend, fast."""

from __future__ import annotations

import json
from dataclasses import replace

from mmfs.megatron.indices.blend import blend_description
from mmfs.megatron.indices.gpt import GptParams


class _Descriptions:
    """Megatron's descriptions of many GPTDatasets and their blend, fast: json.dumps
    with indent runs in pure Python, which costs seconds over thousands of datasets.
    One GptParams.description() with marker values gives the text of every
    GPTDataset of a config; a blend's nests them, indented, as json.dumps would."""

    MARKS = {"dataset_path": "\x00mmfs-path", "num_samples": "\x00mmfs-samples",
             "split": "\x00mmfs-split"}

    def __init__(self) -> None:
        self._templates: dict = {}

    def gpt(self, p: GptParams) -> str:
        fixed = (p.seed, p.sequence_length, p.config_split, json.dumps(p.config_split_matrix),
                 json.dumps(p.tokenizer_identifiers))
        template = self._templates.get(fixed)
        if template is None:
            m = self.MARKS
            marked = replace(p, dataset_path=m["dataset_path"], num_samples=m["num_samples"],
                             split=m["split"])
            template = self._templates[fixed] = marked.description()
        text = template
        for name, value in (("dataset_path", p.dataset_path), ("num_samples", p.num_samples),
                            ("split", p.split)):
            text = text.replace(json.dumps(self.MARKS[name]), json.dumps(value), 1)
        return text

    @staticmethod
    def blend_of(caches: list, split: str, weights: list, size: int | None) -> str:
        """blend() of the descriptions of the GPTDatasets' caches."""
        return _Descriptions.blend([c.description for c in caches], split, weights, size)

    @staticmethod
    def blend(gpt_descriptions: list[str], split: str, weights: list, size: int | None) -> str:
        marker = "\x00mmfs-datasets"
        text = blend_description(marker, split, weights, size)  # type: ignore[arg-type]
        pad = "\n" + " " * 8
        nested = "[]" if not gpt_descriptions else \
            "[" + ",".join(pad + d.replace("\n", pad) for d in gpt_descriptions) + "\n    ]"
        return text.replace(json.dumps(marker), nested, 1)
