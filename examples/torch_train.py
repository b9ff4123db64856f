"""A PyTorch training loop over one data-parallel rank's stream of an mmfs mount,
resuming from the consumed_samples of its checkpoint, also on another layout.

    python examples/torch_train.py MOUNT --rank 0 --iterations 20 --checkpoint ckpt.pt
    # resumed by a job with 2 data-parallel ranks instead of the mount's layout (the
    # global batch stays: the demo's 16 = 2 ranks x micro-batch 2 x 4 accumulation steps):
    python examples/torch_train.py MOUNT --rank 0 --data-parallel-size 2 --checkpoint ckpt.pt

An iteration is Megatron's: one global batch, that is num_microbatches = global batch
size / (micro_batch_size x data_parallel_size) micro-batches of this rank, their
gradients accumulated, then one optimizer step. Each micro-batch is the one
Megatron's DataLoader would give this rank (mmfs.adapters.torch.RankStream: tokens,
labels, loss_mask, position_ids, read by DataLoader workers). Every --save-every
iterations the model and the stream's state_dict (Megatron's consumed_samples: all
ranks' samples so far, a multiple of the global batch size) are saved. Run it again
with the same --checkpoint and it reads on from exactly where it stopped, as a
Megatron job resumed from that iteration would; with another --data-parallel-size
or --micro-batch-size (the global batch size stays) it reads what Megatron's sampler,
rebuilt on that layout at that consumed_samples, gives the rank: the files of
MOUNT/<split>/streams/dp=D,mbs=M,from=C/RRR/ (docs/streams.md). torch is only needed
here; mmfs.loader itself is numpy only.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Iterable, Iterator

from mmfs.loader import Mount


def microbatches_per_iteration(global_batch_size: int, micro_batch_size: int, data_parallel_size: int) -> int:
    """Megatron's num_microbatches for a constant global batch size (its calculator
    refuses a global batch that is not a whole number of micro-batches of every rank)."""
    per_microbatch = micro_batch_size * data_parallel_size
    if global_batch_size % per_microbatch or global_batch_size < per_microbatch:
        raise ValueError(f"global batch size ({global_batch_size}) is not divisible by micro batch size "
                         f"({micro_batch_size}) times data parallel size ({data_parallel_size})")
    return global_batch_size // per_microbatch


def iterations(microbatches: Iterable, per_iteration: int) -> Iterator[list]:
    """The micro-batches grouped into iterations; a last group short of a global
    batch (the split ran out) is not an iteration and is dropped, as Megatron stops."""
    it = iter(microbatches)
    while len(group := list(itertools.islice(it, per_iteration))) == per_iteration:
        yield group


def global_batch_size(mount: Mount, given: int | None, micro_batch_size: int, data_parallel_size: int) -> int:
    """--global-batch-size, else the mount's; Megatron's default is one micro-batch
    of every rank (micro_batch_size x data_parallel_size of the mount's layout)."""
    if given is not None:
        return given
    t = mount.training or {}
    schedule = t.get("batch_schedule", {}).get("kind", "constant")
    if schedule != "constant":
        sys.exit(f"torch_train.py: the mount's global batch size changes ({schedule}); this example runs a "
                 "constant one: give --global-batch-size")
    if t.get("global_batch_size") is not None:
        return int(t["global_batch_size"])
    return micro_batch_size * data_parallel_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mount")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--split", default="train")
    parser.add_argument("--data-parallel-size", type=int, help="default: the mount's training: layout")
    parser.add_argument("--micro-batch-size", type=int, help="default: the mount's training: layout")
    parser.add_argument("--global-batch-size", type=int, help="default: the mount's training: global_batch_size")
    parser.add_argument("--iterations", type=int, default=20, help="iterations (global batches) to run in this job")
    parser.add_argument("--checkpoint", default="mmfs-example-ckpt.pt")
    parser.add_argument("--save-every", type=int, default=5, help="iterations between checkpoints")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    args = parser.parse_args()

    import torch

    from mmfs.adapters.torch import RankStream

    mount = Mount(args.mount)
    stream = RankStream(mount, args.split, args.rank, data_parallel_size=args.data_parallel_size,
                        micro_batch_size=args.micro_batch_size)
    t = mount.training or {}
    gbs = global_batch_size(mount, args.global_batch_size, int(t.get("micro_batch_size", stream.micro_batch_size)),
                            int(t.get("data_parallel_size", stream.data_parallel_size)))
    try:
        per_iteration = microbatches_per_iteration(gbs, stream.micro_batch_size, stream.data_parallel_size)
    except ValueError as exc:
        sys.exit(f"torch_train.py: {exc}")
    vocab = int(max(2**16, (mount.eod or 0) + 1)) if mount.dtype.itemsize <= 2 else 2**17
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        stream.load_state_dict(state["data"])
        print(f"resuming at consumed_samples {stream.state_dict()['consumed_samples']}")

    for step, group in enumerate(iterations(stream.batches(num_workers=args.workers), per_iteration)):
        optimizer.zero_grad()
        total = 0.0
        for batch in group:  # gradient accumulation over the rank's micro-batches
            logits = model(batch["tokens"])
            losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                                       reduction="none")
            mask = batch["loss_mask"].flatten()
            loss = (losses * mask).sum() / mask.sum().clamp(min=1) / per_iteration
            loss.backward()
            total += loss.item()
        optimizer.step()
        samples = [i for batch in group for i in batch["sample_ids"].tolist()]
        print(f"consumed_samples {stream.state_dict()['consumed_samples']} loss {total:.4f} samples {samples}")
        if (step + 1) % args.save_every == 0 or step + 1 == args.iterations:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "data": stream.state_dict()}, args.checkpoint)
        if step + 1 == args.iterations:
            break


if __name__ == "__main__":
    main()
