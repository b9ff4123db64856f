"""Megatron-LM trained through mmfs against Megatron-LM's own loader, loss by loss
(issue 32 item 4).

A tiny GPT (2 layers, hidden 128, sequence 256; --transformer-impl local, no
Transformer Engine; --deterministic-mode, no dropout) trains for 50 iterations twice
on the same data, each variant:
- single, cyclic: once with Megatron's own loader (--data-path, --split, its
  sampler), once with --dataloader-type external and mmfs.adapters.megatron's
  provider reading the mount of `mmfs config --from-megatron` of the same line;
- phases, phases-cyclic (single and cyclic samplers): Megatron's own run in phases
  (--phase-transition-iterations 25: it saves, exits, and is relaunched with phase
  1's --data-path), against the same two launches through the mount of both
  launches' config (phase_mode restart): each launch's train, and the valid and test
  its relaunch builds (phase 1's own, from the carried consumed_valid_samples).
It prints both loss curves and the largest difference of each variant (0 is the
target: the same batches give the same losses) and exits 1 if any differs.

    python benchmarks/megatron_e2e.py prepare --out E2E            # a machine with FUSE (no GPU needed)
    python benchmarks/megatron_e2e.py run --dir E2E --megatron-lm PATH/TO/Megatron-LM [--mount] [--variant V]

`prepare` writes the corpus (byte-level tokens of the Python standard library, as
`make demo`: mmfs.tools.demo), the launch lines, each variant's config, and a plain
folder copy of what each mmfs run reads (its rank streams, mmfs.json and the files'
attributes: mmfs.adapters.megatron_copy), so that `run` needs no FUSE: bring E2E to
the GPU machine. `run --mount` mounts the configs there instead (FUSE needed). `run`
needs PyTorch with CUDA, a GPU, Megatron-LM at core_v0.19.0 (its pretrain_gpt.py;
megatron-core importable from it or installed, its dataset helpers compiled or
compilable: g++ and pybind11), and mmfs importable. Every run goes through this file
(`_train`), which runs pretrain_gpt.py's own main block unchanged, after recording
each iteration's losses at full precision and, for the mmfs runs, handing pretrain()
mount_datasets_provider(MMFS_MOUNT) instead of pretrain_gpt.py's provider (the three
lines of docs/megatron.md). A few minutes on one GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ITERATIONS, TRANSITION = 50, 25
SEQ, MBS, GBS = 256, 4, 32
MODEL = ("--num-layers 2 --hidden-size 128 --num-attention-heads 4 --ffn-hidden-size 512 "
         f"--seq-length {SEQ} --max-position-embeddings {SEQ} --micro-batch-size {MBS} --global-batch-size {GBS} "
         "--lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --weight-decay 0.01 --clip-grad 1.0 "
         "--init-method-std 0.02 --hidden-dropout 0 --attention-dropout 0 --seed 1234 "
         "--tokenizer-type NullTokenizer --vocab-size 257 "
         "--transformer-impl local --deterministic-mode --no-gradient-accumulation-fusion "
         "--no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion --no-persist-layer-norm "
         "--log-interval 1 --eval-interval 25 --eval-iters 2 --num-workers 0 --ckpt-format torch")
DATA0 = "--data-path 0.7 data/stdlib_code 0.3 data/stdlib_prose --split 98,1,1"
DATA1 = "--data-path 0.2 data/stdlib_code 0.8 data/stdlib_prose --split 98,1,1"
ITERS = f"--train-iters {ITERATIONS} --lr-warmup-iters 5"
PHASED = f"--train-samples {ITERATIONS * GBS} --lr-warmup-samples {5 * GBS} --phase-transition-iterations {TRANSITION}"
# variant: the launch line(s) of Megatron's own run (one per phase), all in the variant's folder
VARIANTS = {
    "single": [f"{MODEL} {ITERS} {DATA0}"],
    "cyclic": [f"{MODEL} {ITERS} {DATA0} --dataloader-type cyclic"],
    "phases": [f"{MODEL} {PHASED} {DATA0}", f"{MODEL} {PHASED} {DATA1}"],
    "phases-cyclic": [f"{MODEL} {PHASED} {DATA0} --dataloader-type cyclic",
                      f"{MODEL} {PHASED} {DATA1} --dataloader-type cyclic"],
}


def _checkpoints(variant: str, folder: str) -> list[str]:
    """A run in phases saves at its transition and is relaunched from there."""
    return ["--save", folder, "--load", folder, "--save-interval", "1000"] if len(VARIANTS[variant]) > 1 else []


def megatron_runs(variant: str) -> list[list[str]]:
    """Megatron's own loader: each launch's arguments (phases: saved and relaunched)."""
    return [shlex.split(line) + ["--data-cache-path", "cache-megatron"] + _checkpoints(variant, "ckpt-megatron")
            for line in VARIANTS[variant]]


def mmfs_runs(variant: str) -> list[list[str]]:
    """Through the mount: each of Megatron's launches with --dataloader-type external
    (the same phase transitions and relaunches; the config holds the phases' data)."""
    out = []
    for line in VARIANTS[variant]:
        words = shlex.split(line)
        if "--dataloader-type" in words:
            k = words.index("--dataloader-type")
            del words[k:k + 2]
        out.append(words + ["--dataloader-type", "external"] + _checkpoints(variant, "ckpt-mmfs"))
    return out


def launch_reads(mount: str, data_parallel_size: int = 1) -> list[dict[str, tuple[int, ...]]]:
    """What each launch of an mmfs run reads of each split, per rank: (micro-batch size,
    from, micro-batches[, the phase whose own valid or test it is]). One launch: train
    for every iteration, valid and test whole (the run evaluates at 25 and 50, and
    valid and test after training). A relaunched run in phases: each launch's
    iterations of train, and its evaluations of its phase's own valid and test
    (mmfs.json's phases[k].splits: where its loader starts, what it reads)."""
    from mmfs.loader import Mount

    m = Mount(mount)
    group = MBS * data_parallel_size
    if not m.phases:
        return [{"train": (MBS, 0, ITERATIONS * GBS // group),
                 **{s: (MBS, 0, m.samples[s] // group) for s in ("valid", "test") if m.samples.get(s, 0) >= group}}]
    out = []
    for k, phase in enumerate(m.phases["phases"]):
        reads = {"train": (MBS, phase["start_sample"], (phase["end_sample"] - phase["start_sample"]) // group)}
        for split in ("valid", "test"):  # (a launch builds both loaders, whether it reads them or not)
            start, end = phase["splits"][split]["evaluations"]["consumed_samples"]
            reads[split] = (MBS, start, (end - start) // group, k)
        out.append(reads)
    return out


def mmfs_cli(*args, cwd: Path, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "mmfs.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    if done.returncode:
        raise SystemExit(f"mmfs {' '.join(map(str, args))}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


def prepare(out: Path) -> None:
    """The corpus, the configs and the copies of what the mmfs runs read."""
    from mmfs.adapters.megatron_copy import copy_job_files
    from mmfs.tools.demo import build_data

    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    if not (data / "stdlib_prose.idx").exists():
        build_data(data)
    for variant, lines in VARIANTS.items():
        folder = out / variant
        folder.mkdir(exist_ok=True)
        if not (folder / "data").exists():
            (folder / "data").symlink_to("../data")
        argv = []
        for k, line in enumerate(lines):
            (folder / f"launch{k}.args").write_text(f"{line} --data-cache-path cache-mmfs\n")
            argv += (["--next-phase"] if k else []) + [f"@launch{k}.args"]
        (folder / "run.yaml").write_text(mmfs_cli("config", "--from-megatron", *argv, cwd=folder,
                                                  env={"WORLD_SIZE": "1"}))
        (folder / "mnt").mkdir(exist_ok=True)
        mmfs_cli("mount", "run.yaml", "mnt", cwd=folder)
        try:
            copies = [copy_job_files(folder / "mnt", folder / "mount-copy", 1, reads)
                      for reads in launch_reads(str(folder / "mnt"))]
        finally:
            mmfs_cli("umount", "mnt", cwd=folder)
        print(f"{variant}: {sum(c['files'] for c in copies)} micro-batch files, "
              f"{sum(c['bytes'] for c in copies) / 1e6:.1f} MB in {folder / 'mount-copy'}")
    manifest = {v: {"megatron": megatron_runs(v), "mmfs": mmfs_runs(v)} for v in VARIANTS}
    (out / "e2e.json").write_text(json.dumps(manifest, indent=1) + "\n")


# -- on the GPU machine ---------------------------------------------------------------


def train(argv: list[str]) -> None:
    """`_train LOSSES PRETRAIN_GPT [megatron args]`: pretrain_gpt.py's main block, with
    each iteration's losses written to LOSSES (JSON lines, rank 0) and, when MMFS_MOUNT
    is set, the mount's provider given to pretrain()."""
    losses, script, megatron_args = argv[0], argv[1], argv[2:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    import megatron.training
    import megatron.training.training as training
    import numpy as np

    def record(kind: str, iteration: int, values: dict) -> None:
        if int(os.environ.get("RANK", "0")) == 0:  # torchrun's global rank
            row = {"kind": kind, "iteration": int(iteration)}
            for key, value in values.items():
                value = value.detach().float().cpu() if hasattr(value, "detach") else value
                row[key] = [float(x) for x in np.asarray(value, dtype=np.float64).ravel()]
            with open(losses, "a") as f:
                f.write(json.dumps(row) + "\n")

    log = training.training_log

    def training_log(loss_dict, total_loss_dict, learning_rate, iteration, *rest, **kw):
        record("train", iteration, loss_dict)
        return log(loss_dict, total_loss_dict, learning_rate, iteration, *rest, **kw)

    evaluate = training.evaluate

    def evaluate_recorded(*args, **kw):
        result = evaluate(*args, **kw)
        if isinstance(result, tuple) and isinstance(result[0], dict):
            record("eval", megatron.training.get_args().curr_iteration, result[0])
        return result

    training.training_log, training.evaluate = training_log, evaluate_recorded
    if os.environ.get("MMFS_MOUNT"):
        from mmfs.adapters.megatron import mount_datasets_provider

        pretrain = megatron.training.pretrain

        def pretrain_on_mount(config, _provider, *args, **kw):
            return pretrain(config, mount_datasets_provider(os.environ["MMFS_MOUNT"]), *args, **kw)

        megatron.training.pretrain = pretrain_on_mount  # what pretrain_gpt.py imports by name
    sys.argv = [script, *megatron_args]
    runpy.run_path(script, run_name="__main__")


def launch(folder: Path, megatron_lm: Path, words: list[str], losses: Path, mount: Path | None,
           gpus: int) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(megatron_lm), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    env.pop("MMFS_MOUNT", None)
    if mount is not None:
        env["MMFS_MOUNT"] = str(mount)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus),
           str(Path(__file__).resolve()), "_train", str(losses), str(megatron_lm / "pretrain_gpt.py"), *words]
    with open(losses.with_suffix(".log"), "a") as log:
        done = subprocess.run(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{folder.name}: a run failed (exit {done.returncode}); see {losses.with_suffix('.log')}")


def read_losses(path: Path) -> dict[tuple[str, int, int], float]:
    """(kind, iteration, n) -> the n-th loss recorded for that iteration (lm loss:
    Megatron's summed loss / tokens where it reports the pair)."""
    out: dict = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        values = row.get("lm loss")
        if values:
            n = sum(1 for k in out if k[:2] == (row["kind"], row["iteration"]))
            out[row["kind"], row["iteration"], n] = values[0] / values[1] if len(values) == 2 else values[0]
    return out


def compare(variant: str, megatron: dict, mmfs: dict, kinds: tuple[str, ...]) -> float:
    """Print both curves; the largest absolute difference (inf where one run lacks a
    loss the other has, or neither has any)."""
    keys = sorted(k for k in set(megatron) | set(mmfs) if k[0] in kinds)
    print(f"{variant}: {'':5} {'iteration':>9} {'Megatron loader':>22} {'mmfs provider':>22} {'difference':>12}")
    worst = 0.0 if keys else math.inf
    for key in keys:
        a, b = megatron.get(key), mmfs.get(key)
        diff = math.inf if a is None or b is None else abs(a - b)
        worst = max(worst, diff)
        print(f"{variant}: {key[0]:5} {key[1]:9d} {a!r:>22} {b!r:>22} {diff:12.3g}")
    print(f"{variant}: largest difference {worst:.3g} over {len(keys)} losses")
    return worst


def run(folder: Path, megatron_lm: Path, use_mount: bool, gpus: int, variants: list[str] | None = None) -> int:
    manifest = json.loads((folder / "e2e.json").read_text())
    worst = {}
    for variant, runs in manifest.items():
        if variants and variant not in variants:
            continue
        where = folder / variant
        for name in ("losses-megatron.jsonl", "losses-mmfs.jsonl", "losses-megatron.log", "losses-mmfs.log"):
            (where / name).unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(where / "ckpt-megatron"), str(where / "ckpt-mmfs")], check=True)
        for words in runs["megatron"]:
            launch(where, megatron_lm, words, where / "losses-megatron.jsonl", None, gpus)
        mount = where / "mount-copy"
        if use_mount:
            mmfs_cli("mount", "run.yaml", "mnt", cwd=where)
            mount = where / "mnt"
        try:
            for words in runs["mmfs"]:
                launch(where, megatron_lm, words, where / "losses-mmfs.jsonl", mount, gpus)
        finally:
            if use_mount:
                mmfs_cli("umount", "mnt", cwd=where)
        worst[variant] = compare(variant, read_losses(where / "losses-megatron.jsonl"),
                                 read_losses(where / "losses-mmfs.jsonl"), ("train", "eval"))
    print("largest differences: " + ", ".join(f"{v} {d:.3g}" for v, d in worst.items()))
    return 0 if all(d == 0 for d in worst.values()) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_train":
        train(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="corpus, configs and the copies of what the mmfs runs read")
    prep.add_argument("--out", type=Path, required=True)
    go = sub.add_parser("run", help="train each variant both ways and compare the losses (GPU)")
    go.add_argument("--dir", type=Path, required=True, help="what prepare wrote")
    go.add_argument("--megatron-lm", type=Path, required=True, help="Megatron-LM at core_v0.19.0")
    go.add_argument("--mount", action="store_true", help="mount the configs here instead of reading the copies")
    go.add_argument("--gpus", type=int, default=1)
    go.add_argument("--variant", action="append", choices=list(VARIANTS),
                    help="run only this variant (repeatable; default: all four)")
    args = p.parse_args(argv)
    if args.command == "prepare":
        prepare(args.out.resolve())
        return 0
    return run(args.dir.resolve(), args.megatron_lm.resolve(), args.mount, args.gpus, args.variant)


if __name__ == "__main__":
    raise SystemExit(main())
