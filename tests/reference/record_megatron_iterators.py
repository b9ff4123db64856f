"""Record what Megatron-LM's own data path hands the training loop, and check the
mmfs provider inside the same function, into megatron_iterators.json beside this
file (test_megatron_iterators.py reads it; it never imports torch or Megatron).

    python tests/reference/record_megatron_iterators.py --megatron-lm PATH/TO/Megatron-LM [--mmfs .venv/bin/mmfs]

Needs torch 2.13.0 (CPU), the megatron-core 0.19.2 wheel (its megatron/training),
and a Megatron-LM checkout at core_v0.19.0 for pretrain_gpt.py (with its
gpt_builders.py and model_provider.py; appended to sys.path, so the wheel's
megatron package is the one imported). mmfs (its `mmfs` command) makes and mounts
the configs. Deterministic: running it twice writes the same file.

For each case, a pretrain_gpt.py launch line (Megatron's own parse_args and
validate_args read it) and a resume state (iteration and consumed counts, as
load_checkpoint sets them), with a simulated data-parallel size D:
- Megatron's path: megatron.training.training.build_train_valid_test_data_iterators
  called with pretrain_gpt.train_valid_test_datasets_provider (GPTDataset and
  BlendedDataset through BlendedMegatronDatasetBuilder, Megatron's samplers in
  build_pretraining_data_loader, cyclic_iter), once per data-parallel rank;
- mmfs's path: the same launch line with --dataloader-type external, the mount of
  `mmfs config --from-megatron` of that line, and
  mmfs.adapters.megatron.mount_datasets_provider(MOUNT) with Megatron's own get_args
  and parallel state, in the same build_train_valid_test_data_iterators;
then the first iterations' micro-batches each rank's train iterator gives (the
training loop's next() calls: global batch / (micro batch x D) per iteration), the
first evaluation's (eval_iters steps of eval global batch / (eval micro batch x D))
and the first two of test, as digests of GPTDataset's fields.

The phases-* cases are Megatron-LM's own relaunch at --phase-transition-iterations
(the mount: both launches as one phase_mode restart config): the launch of phase 1,
built at its transition, under the single and the cyclic sampler (sharded and not:
train read by a sampler over phase 1's own dataset from its sample 0), and on
another data-parallel size than the config's with --eval-micro-batch-size 1 (phase
1's own valid and test through the mount's streams of that layout).

How it runs on a CPU (Python 3.11): typing.override (3.12) is given a stand-in so
megatron.training imports; torch.distributed is a one-process gloo group;
megatron.core.parallel_state's rank functions answer for the simulated rank
(data-parallel rank r of D, tensor-parallel rank 0, first and last pipeline stage);
the `flags` tensor that build_train_valid_test_data_loaders makes on 'cuda' is made
on the CPU (training.py's torch.tensor is wrapped to drop device='cuda'); DataLoader
workers are off (--num-workers 0: where samples come from is unchanged).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import types
import typing
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "megatron_iterators.json"
FIELDS = ("tokens", "labels", "attention_mask", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen")
# what the provider reads of Megatron's args (the CI test rebuilds them from this)
PROVIDER_ARGS = ("dataloader_type", "seq_length", "micro_batch_size", "global_batch_size", "eval_micro_batch_size",
                 "eval_global_batch_size", "consumed_train_samples", "consumed_valid_samples", "iteration",
                 "rampup_batch_size", "step_batch_size_schedule", "phase_transition_iterations", "full_validation",
                 "multiple_validation_sets", "hybrid_context_parallel", "sft", "eod_mask_loss",
                 "reset_position_ids", "reset_attention_mask", "create_attention_mask_in_dataloader",
                 "dataloader_inter_document_masking")

MODEL = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --max-position-embeddings 128 --lr 1e-4 "
         "--transformer-impl local --tokenizer-type NullTokenizer --vocab-size 50256 --num-workers 0 --seed 1234")
BLEND = "--data-path 0.7 data/u16_docs 0.3 data/u16_small --split 90,8,2"
RUN = "--seq-length 128 --micro-batch-size 2 --global-batch-size 16 --eval-interval 10 --eval-iters 2"
ITERS = f"{RUN} --train-iters 20"
# name: (launch line(s) of the job as it ran, data-parallel size D, the resume state
#        (iteration, consumed train, consumed valid), iterations read, D of the launch the
#        mount's config is made from, None: the job's own[, arguments the resumed job
#        adds to its launch line, which the mount's config is not made from])
PHASE0 = f"{RUN} --train-samples 320 {BLEND} --phase-transition-iterations 10"
PHASE1 = (f"{RUN} --train-samples 320 --data-path 0.5 data/u16_multiseq 0.5 data/u16_docs --split 90,8,2 "
          "--phase-transition-iterations 10")
CYCLIC = "--dataloader-type cyclic"
CASES = {
    "single": ([f"{ITERS} {BLEND}"], 4, (0, 0, 0), 3, None),
    "single-resumed": ([f"{ITERS} {BLEND} --eod-mask-loss --reset-position-ids"], 4, (12, 192, 32), 3, None),
    "cyclic": ([f"{ITERS} {BLEND} --dataloader-type cyclic"], 4, (0, 0, 0), 2, None),
    # 4 micro-batches from the end of epoch 0 on, into epoch 1 (cyclic_iter iterates again)
    "cyclic-epoch": ([f"{ITERS} {BLEND} --dataloader-type cyclic"], 4, (19, 304, 32), 3, None),
    # 330 samples in micro-batches of 1 on 4 ranks: ranks 0-1 read 83 in epoch 0, 2-3 82,
    # and each starts epoch 1 from its own count
    "cyclic-unsharded": ([f"{RUN.replace('--micro-batch-size 2', '--micro-batch-size 1')} --train-samples 330 "
                          f"{BLEND} --dataloader-type cyclic --no-data-sharding"], 4, (19, 304, 32), 3, None),
    # the mount made from the dp 4 launch; the job resumed at iteration 7 on dp 2
    "resumed-dp2": ([f"{ITERS} {BLEND}"], 2, (7, 112, 0), 3, 4),
    "resumed-dp2-cyclic": ([f"{ITERS} {BLEND} --dataloader-type cyclic"], 2, (7, 112, 0), 3, 4),
    # Megatron-LM's own phase relaunch: phase 1 (from iteration 10) built from its own
    # --data-path; the mount: both launches as one config (phase_mode restart), train
    # read on from the global consumed count, valid and test phase 1's own
    "phases-restart": ([PHASE0, PHASE1], 2, (10, 160, 32), 3, None),
    # the same under the cyclic sampler: the relaunch's train sampler over phase 1's own
    # BlendedDataset from its sample 0, valid's over phase 1's own valid at consumed 32
    "phases-restart-cyclic": ([f"{PHASE0} {CYCLIC}", f"{PHASE1} {CYCLIC}"], 2, (10, 160, 32), 3, None),
    "phases-restart-cyclic-unsharded": ([f"{PHASE0} {CYCLIC} --no-data-sharding",
                                         f"{PHASE1} {CYCLIC} --no-data-sharding"], 2, (10, 160, 32), 3, None),
    # the mount made from the dp 4 launches; the relaunch at the transition runs on dp 2
    # (and reads valid and test in micro-batches of 1): phase 1's own valid and test on
    # a layout the config does not have
    "phases-restart-dp2": ([PHASE0, PHASE1], 2, (10, 160, 32), 3, 4, "--eval-micro-batch-size 1"),
    "phases-restart-cyclic-dp2": ([f"{PHASE0} {CYCLIC}", f"{PHASE1} {CYCLIC}"], 2, (10, 160, 32), 3, 4,
                                  "--eval-micro-batch-size 1"),
}


def digest(batch: dict) -> str:
    h = hashlib.sha256()
    for name in FIELDS:
        if name in batch and batch[name] is not None:
            value = np.ascontiguousarray(np.asarray(batch[name]))
            h.update(f"{name}:{value.dtype.str}:{value.shape};".encode())
            h.update(value.tobytes())
    return h.hexdigest()[:16]


def prepare_megatron(megatron_lm: str):
    """Import megatron.training on Python 3.11 and a CPU; the modules used."""
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # Python 3.12's decorator, a no-op at run time
    sys.path.append(megatron_lm)  # pretrain_gpt.py and its siblings; the wheel's megatron comes first
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    import megatron.training.training as training
    import pretrain_gpt
    from megatron.core import parallel_state
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.global_vars import set_args

    cpu_torch = types.ModuleType("torch")
    cpu_torch.__dict__.update(torch.__dict__)

    def tensor(*a, device=None, **k):  # the flags tensor: made on 'cuda' by Megatron, here on the CPU
        return torch.tensor(*a, **k)

    cpu_torch.tensor = tensor
    training.torch = cpu_torch
    return types.SimpleNamespace(torch=torch, training=training, pretrain_gpt=pretrain_gpt, mpu=parallel_state,
                                 parse_args=parse_args, validate_args=validate_args, set_args=set_args)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def data_parallel_rank(mpu, rank: int, size: int):
    """Megatron's parallel state answering for data-parallel rank `rank` of `size`
    (tensor-parallel rank 0 of 1, the first and last pipeline stage)."""
    names = ("get_data_parallel_rank", "get_data_parallel_world_size", "get_tensor_model_parallel_rank",
             "get_tensor_model_parallel_world_size", "is_pipeline_first_stage", "is_pipeline_last_stage")
    saved = {n: getattr(mpu, n) for n in names}
    mpu.get_data_parallel_rank = lambda *a, **k: rank
    mpu.get_data_parallel_world_size = lambda *a, **k: size
    mpu.get_tensor_model_parallel_rank = lambda *a, **k: 0
    mpu.get_tensor_model_parallel_world_size = lambda *a, **k: 1
    mpu.is_pipeline_first_stage = lambda *a, **k: True
    mpu.is_pipeline_last_stage = lambda *a, **k: True
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(mpu, n, f)


def megatron_args(m, line: str, world_size: int, resume: tuple[int, int, int], cache: str):
    os.environ.update(WORLD_SIZE=str(world_size), RANK="0", LOCAL_RANK="0")
    sys.argv = ["pretrain_gpt.py", *shlex.split(f"{MODEL} {line} --data-cache-path {cache}")]
    with contextlib.redirect_stdout(sys.stderr):
        args = m.parse_args()
        m.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    args.iteration, args.consumed_train_samples, args.consumed_valid_samples = resume
    m.set_args(args)
    with contextlib.redirect_stdout(sys.stderr):
        m.training.update_train_iters(args)  # what pretrain() does for --train-samples
    return args


def read_iterators(m, provider, args, size: int, iterations: int, splits: tuple[str, ...]) -> dict:
    """{split: {rank: [digest of each micro-batch]}} as the training loop and
    evaluate() call next() on the iterators build_train_valid_test_data_iterators makes."""
    per_step = args.global_batch_size // (args.micro_batch_size * size)
    eval_steps = args.eval_iters * (args.eval_global_batch_size // (args.eval_micro_batch_size * size))
    counts = {"train": iterations * per_step, "valid": eval_steps, "test": 2}
    out: dict = {split: {} for split in splits}
    for rank in range(size):
        with data_parallel_rank(m.mpu, rank, size), contextlib.redirect_stdout(sys.stderr):
            built = m.training.build_train_valid_test_data_iterators(provider)
            iterators = dict(zip(("train", "valid", "test"), built))
            for split in splits:
                it = iterators[split]
                out[split][str(rank)] = [digest({k: v.numpy() for k, v in next(it).items()
                                                 if isinstance(v, m.torch.Tensor)}) for _ in range(counts[split])]
    return out


def run(*argv, cwd: Path, **env) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, env={**os.environ, **env})
    if done.returncode:
        raise SystemExit(f"{' '.join(map(str, argv))}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return done.stdout


def capture_num_samples(provider, seen: list):
    """The provider, noting the train/valid/test counts Megatron asks of it."""
    def wrapped(train_val_test_num_samples, vp_stage=None):
        seen.append(list(train_val_test_num_samples))
        return provider(train_val_test_num_samples, vp_stage=vp_stage) if vp_stage is not None \
            else provider(train_val_test_num_samples)

    wrapped.is_distributed = True
    return wrapped


def run_case(m, name: str, case: tuple, work: Path, mmfs: str) -> dict:
    lines, size, resume, iterations, mount_size, *job_extra = case
    job_line = " ".join([lines[-1] if name.startswith("phases") else lines[0], *job_extra])
    splits = ("train", "valid", "test")
    folder = work / name
    folder.mkdir()
    (folder / "data").symlink_to(work / "data")  # a config's paths are relative to its folder
    # the mount's config, from the launch line(s) as they ran (another world size for a resume)
    argv = []
    for k, line in enumerate(lines):
        (folder / f"launch{k}.args").write_text(f"{MODEL} {line} --data-cache-path {folder}/mmfs-cache\n")
        argv += (["--next-phase"] if k else []) + [f"@{folder}/launch{k}.args"]
    config = run(mmfs, "config", "--from-megatron", *argv, cwd=work, WORLD_SIZE=str(mount_size or size))
    (folder / "run.yaml").write_text(config)
    (folder / "mnt").mkdir()
    run(mmfs, "mount", folder / "run.yaml", folder / "mnt", cwd=work)
    try:
        from mmfs.adapters.megatron import mount_datasets_provider

        seen: list = []
        args = megatron_args(m, job_line, size, resume, f"{folder}/megatron-cache")
        m.pretrain_gpt.train_valid_test_datasets_provider.is_distributed = True
        megatron = read_iterators(m, capture_num_samples(m.pretrain_gpt.train_valid_test_datasets_provider, seen),
                                  args, size, iterations, splits)
        args = megatron_args(m, f"{job_line} --dataloader-type external", size, resume, f"{folder}/megatron-cache")
        provider_args = {k: getattr(args, k, None) for k in PROVIDER_ARGS}
        mmfs_reads = read_iterators(m, capture_num_samples(mount_datasets_provider(str(folder / "mnt")), seen),
                                    args, size, iterations, splits)
    finally:
        run(mmfs, "umount", folder / "mnt", cwd=work)
    differ = [f"{split} rank {r} micro-batch {j}" for split in splits for r in megatron[split]
              for j, (a, b) in enumerate(zip(megatron[split][r], mmfs_reads[split][r])) if a != b]
    print(f"{name}: {sum(len(v) for s in megatron.values() for v in s.values())} micro-batches, "
          f"{'all equal' if not differ else f'{len(differ)} differ, first: {differ[0]}'}", flush=True)
    return {"launch": [f"{MODEL} {line}" for line in lines], "job_extra": " ".join(job_extra),
            "world_size": mount_size or size,
            "data_parallel_size": size, "resume": list(resume), "iterations": iterations,
            "num_samples": seen[-1], "provider_args": provider_args, "megatron": megatron,
            "mmfs_equal": not differ}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-lm", required=True, help="a Megatron-LM checkout at core_v0.19.0")
    parser.add_argument("--mmfs", default=str(ROOT / ".venv" / "bin" / "mmfs"), help="the mmfs command")
    parser.add_argument("--cases", default=",".join(CASES))
    opts = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    m = prepare_megatron(opts.megatron_lm)
    import megatron.core

    out = {"about": "Megatron-LM's build_train_valid_test_data_iterators with pretrain_gpt.py's provider "
                    "(digests: sha256 of GPTDataset's fields, first 16 hex), by record_megatron_iterators.py",
           "torch_version": m.torch.__version__, "megatron_core_version": megatron.core.__version__,
           "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "data").symlink_to(ROOT / "tests" / "golden" / "data", target_is_directory=True)
        os.chdir(work)
        for name in opts.cases.split(","):
            out["cases"][name] = run_case(m, name, CASES[name], work, opts.mmfs)
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
