"""The launch lines docs/megatron.md and docs/config.md show are lines Megatron-LM's own
parse_args and validate_args accept (issue 42 item 6), recorded by
tests/reference/record_megatron_docs.py: the docs still hold the very lines recorded,
and `mmfs config --from-megatron` reads from them what Megatron parsed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "reference"))
RECORDED = json.loads((HERE / "reference" / "megatron_docs.json").read_text())

from record_megatron_docs import doc_lines, words  # noqa: E402

from mmfs.tools.megatron.args import to_config  # noqa: E402


@pytest.mark.parametrize("name", sorted(RECORDED["lines"]))
def test_a_docs_launch_line_is_one_megatron_accepts(name):
    entry = RECORDED["lines"][name]
    text, world = doc_lines()[name]
    assert (text, world) == (entry["text"], entry["world_size"]), "the docs' line changed: record it again"
    assert "refused" not in entry, entry.get("refused")
    config, _ = to_config(words(text), {"WORLD_SIZE": str(world)})
    megatron = entry["megatron"]
    assert config["training"]["data_parallel_size"] == megatron["data_parallel_size"]
    assert config["training"]["micro_batch_size"] == megatron["micro_batch_size"]
    assert config["training"]["global_batch_size"] == megatron["global_batch_size"]
    assert config["sequence_length"] == megatron["seq_length"] and config["split"] == megatron["split"]
    assert config["data_path"] == megatron["data_path"] and config["seed"] == megatron["seed"]
