"""`mmfs which`: the samples of an iteration per rank (against the golden samplers'
output), their pieces and documents (against the .idx), from a config and a mount."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from golden_cases import PUBLIC, write_case_config
from mmfs.formats import open_dataset
from mmfs.formats.writer import IndexedDatasetWriter
from mmfs.megatron import open_corpus
from mount_fixtures import mmfs, mounted


def _config(tmp_path: Path, case: str, training: dict) -> Path:
    path = write_case_config(case, tmp_path / case)
    raw = yaml.safe_load(path.read_text())
    raw["training"] = training
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _which_json(*args) -> dict:
    proc = mmfs("which", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_which_names_megatrons_samples_for_every_rank(tmp_path):
    golden = json.loads((PUBLIC / "p2_blend2_u16" / "ranks-single_dp4_mb2.json").read_text())
    config = _config(tmp_path, "p2_blend2_u16", {"data_parallel_size": 4, "micro_batch_size": 2,
                                                 "global_batch_size": 24})
    corpus = open_corpus(str(config), progress=False)
    reader = corpus.splits["train"]
    per_iteration = 24 // 8
    for iteration in (1, 2, 7):
        result = _which_json(config, "--iteration", iteration)
        assert result["consumed_samples"] == [(iteration - 1) * 24, iteration * 24]
        assert [r["rank"] for r in result["ranks"]] == [0, 1, 2, 3]
        for r in result["ranks"]:
            for b in r["microbatches"]:
                n = (iteration - 1) * per_iteration + b["microbatch"]
                assert [s["sample"] for s in b["samples"]] == golden["ranks"]["train"][str(r["rank"])][n]
                assert b["file"] == f"train/ranks/{r['rank']:03d}/{n:07d}.bin"
                for s in b["samples"]:
                    name, pieces = reader.provenance(s["sample"])
                    assert s["dataset"] == name
                    assert [(p["sequence"], p["sequence_tokens"][0], p["sequence_tokens"][1] - p["sequence_tokens"][0])
                            for p in s["pieces"]] == pieces
                    ends = np.cumsum([n for _s, _o, n in pieces]).tolist()
                    assert [p["sample_tokens"][1] for p in s["pieces"]] == ends
    one = _which_json(config, "--iteration", 2, "--rank", 3, "--microbatch", 1)
    assert len(one["ranks"]) == 1 and [b["microbatch"] for b in one["ranks"][0]["microbatches"]] == [1]
    assert [s["sample"] for s in one["ranks"][0]["microbatches"][0]["samples"]] == golden["ranks"]["train"]["3"][4]


def test_documents_follow_the_idx_document_table(tmp_path):
    # u16_multiseq has several sequences per document
    config = _config(tmp_path, "p4_single_multiseq", {"data_parallel_size": 2, "micro_batch_size": 3,
                                                      "dataloader_type": "cyclic", "data_sharding": False,
                                                      "global_batch_size": 12})
    ds = open_dataset(str(PUBLIC.parent / "data" / "u16_multiseq"))
    docs = np.asarray(ds.document_indices)
    seen = set()
    for iteration in (1, 50, 400):  # 400 runs into later epochs of the cyclic sampler
        result = _which_json(config, "--iteration", iteration)
        for r in result["ranks"]:
            for b in r["microbatches"]:
                for s in b["samples"]:
                    for p in s["pieces"]:
                        d = p["document"]
                        assert docs[d] <= p["sequence"] < docs[d + 1]
                        seen.add(p["sequence"] != d)
    assert True in seen  # sequence ids and document ids do differ here
    assert _which_json(config, "--iteration", 400)["ranks"][0]["microbatches"][0]["epoch"] > 0


def test_which_from_a_mount_matches_which_from_its_config(tmp_path):
    config = _config(tmp_path, "p1_single_u16", {"data_parallel_size": 3, "micro_batch_size": 2,
                                                 "dataloader_type": "cyclic", "global_batch_size": 6})
    from_config = _which_json(config, "--iteration", 5, "--split", "valid")
    with mounted(config, tmp_path / "mnt") as m:
        from_mount = _which_json(m.path, "--iteration", 5, "--split", "valid")
        text = mmfs("which", m.path, "--iteration", 5, "--split", "valid", "--rank", 1)
    assert from_mount["ranks"] == from_config["ranks"]
    assert text.returncode == 0 and "rank 1 micro-batch 0" in text.stdout and "document" in text.stdout


def test_text_decodes_byte_level_tokens(tmp_path):
    texts = [f"document {i}: " + "hello world " * (i % 5 + 1) for i in range(200)]
    writer = IndexedDatasetWriter(str(tmp_path / "bytes.bin"), dtype=np.uint16)
    for text in texts:
        writer.add_item(np.append(np.frombuffer(text.encode(), np.uint8).astype(np.uint16), np.uint16(256)))
        writer.end_document()
    writer.finalize(str(tmp_path / "bytes.idx"))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": "bytes"}], "split": "100,0,0", "sequence_length": 64, "seed": 3,
        "tokenizer": {"eod": 256, "vocab_size": 257}, "cache_dir": "cache",
        "training": {"data_parallel_size": 1, "micro_batch_size": 2, "global_batch_size": 2}}))
    proc = mmfs("which", config, "--iteration", 3, "--text", "--json")
    assert proc.returncode == 0, proc.stderr
    pieces = [p for s in json.loads(proc.stdout)["ranks"][0]["microbatches"][0]["samples"]
              for p in s["pieces"]]
    assert len(pieces) > 2
    for p in pieces:
        a, z = p["sequence_tokens"]
        assert p["text"] == (texts[p["sequence"]] + "\x00")[a:z].replace("\x00", "<|eod|>")


def test_text_with_a_huggingface_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(50257)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    tok.save(str(tmp_path / "tokenizer.json"))
    config = _config(tmp_path, "p1_single_u16", {"data_parallel_size": 1, "micro_batch_size": 1,
                                                 "global_batch_size": 1})
    result = _which_json(config, "--iteration", 1, "--text", "--tokenizer", tmp_path / "tokenizer.json")
    piece = result["ranks"][0]["microbatches"][0]["samples"][0]["pieces"][0]
    ds = open_dataset(str(PUBLIC.parent / "data" / "u16_docs"))
    a, z = piece["sequence_tokens"]
    assert piece["text"].split() == [f"w{t}" for t in ds.get(piece["sequence"], a, z - a)]


@pytest.mark.parametrize("training,args,message", [
    (None, [], "training: missing"),
    ({"data_parallel_size": 2, "micro_batch_size": 2}, [], "training.global_batch_size: missing"),
    ({"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 4}, ["--iteration", "0"],
     "iterations count from 1"),
    ({"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 4}, ["--iteration", "100000"],
     "past the end of the train split"),
    ({"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 4}, ["--rank", "2"],
     "data_parallel_size is 2"),
    ({"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 4}, ["--text"],
     "give --tokenizer"),
])
def test_which_errors_are_one_line(tmp_path, training, args, message):
    config = write_case_config("p1_single_u16", tmp_path / "c")
    if training:
        raw = yaml.safe_load(config.read_text())
        raw["training"] = training
        config.write_text(yaml.safe_dump(raw))
    if "--iteration" not in args:
        args = [*args, "--iteration", "1"]
    proc = mmfs("which", config, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def _not_a_tokenizer(tmp_path: Path, kind: str) -> Path:
    if kind == "dev-zero":
        return Path("/dev/zero")
    if kind == "fifo":
        os.mkfifo(tmp_path / "fifo.json")
        return tmp_path / "fifo.json"
    sparse = tmp_path / "huge.json"  # 6 GB that take no disk
    with open(sparse, "wb") as f:
        f.truncate(6 << 30)
    return sparse


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "sparse"])
def test_a_tokenizer_file_is_checked_before_it_is_read(tmp_path, kind):
    bad = _not_a_tokenizer(tmp_path, kind)
    config = _config(tmp_path, "p1_single_u16", {"data_parallel_size": 1, "micro_batch_size": 1,
                                                 "global_batch_size": 1})
    proc = mmfs("which", config, "--iteration", 1, "--text", "--tokenizer", bad)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert str(bad) in proc.stderr
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "a"}\n')
    proc = mmfs("preprocess", "--input", jsonl, "--output-prefix", tmp_path / "out", "--tokenizer-type",
                "HuggingFaceTokenizer", "--tokenizer-model", bad)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert str(bad) in proc.stderr


def test_which_consumed_is_a_job_resumed_there_also_past_64_bits(tmp_path):
    """--consumed C: Megatron's sampler rebuilt at C (an unsharded cyclic run's ranks
    drift apart after the first epoch, so there it is not the uninterrupted run's
    iteration); any C whose epoch torch's manual_seed takes, answered at once."""
    from mmfs.megatron.sampling.rankplan import plan_stream, rank_ids

    for sharding in (False, True):
        config = _config(tmp_path / str(sharding), "p1_single_u16", {
            "data_parallel_size": 3, "micro_batch_size": 2, "dataloader_type": "cyclic", "data_sharding": sharding,
            "global_batch_size": 12})
        total = len(open_corpus(str(config), progress=False).splits["train"])
        active = total - total % 6
        for consumed in (600, 7 * active + 12, (2**64 - 1) * active + 6):
            result = _which_json(config, "--consumed", consumed)
            plan = plan_stream(total, 2, 3, consumed, "cyclic", sharding)
            for r in result["ranks"]:
                want = rank_ids(plan, r["rank"])
                for b in r["microbatches"]:
                    assert [s["sample"] for s in b["samples"]] == want[b["microbatch"]].tolist()
                    assert b["epoch"] == consumed // active
        past = mmfs("which", config, "--consumed", 2**64 * active)
        assert past.returncode == 2 and past.stderr.count("\n") == 1 and "2**64 - 1" in past.stderr, past.stderr
    far = mmfs("which", config, "--iteration", 10**15)  # sharded: any epoch at once
    assert far.returncode == 0, far.stderr
    unsharded = tmp_path / "False" / "p1_single_u16" / "config.yaml"
    far = mmfs("which", unsharded, "--iteration", 10**15)  # unsharded: walked pass by pass, bounded
    assert far.returncode == 2 and far.stderr.count("\n") == 1 and "--consumed" not in far.stderr and \
        "a job resumed there is answered at once" in far.stderr, far.stderr


@pytest.mark.parametrize("manifest", ["[]", '{"config_path": 5}', "fifo", "dev-zero"])
def test_a_folder_whose_mmfs_json_is_not_a_mounts_is_one_line(tmp_path, manifest):
    """`which`, `report` and `resume-check`-style readers of MOUNT/mmfs.json: a JSON that is
    not a mapping was a traceback, a FIFO hung every reader, /dev/zero filled memory."""
    folder = tmp_path / "notamount"
    folder.mkdir()
    path = folder / "mmfs.json"
    if manifest == "fifo":
        os.mkfifo(path)
    elif manifest == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_text(manifest)
    for command in (["which", folder, "--iteration", "1"], ["report", folder, "--json"]):
        proc = mmfs(*command)
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert "mmfs.json" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("sharding, words", [(True, "cyclic (sharded) sampler"), (False, "cyclic (unsharded) sampler")])
def test_a_cyclic_sampler_is_named_cyclic(tmp_path, sharding, words):
    training = {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8, "dataloader_type": "cyclic",
                "data_sharding": sharding}
    config = _config(tmp_path, "p2_blend2_u16", training)
    proc = mmfs("which", config, "--iteration", 3)
    assert proc.returncode == 0, proc.stderr
    assert words in proc.stdout and ", sharded sampler" not in proc.stdout, proc.stdout
