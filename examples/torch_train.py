"""A PyTorch training loop over one data-parallel rank's stream of an mmfs mount,
resuming from the consumed_samples of its checkpoint, also on another layout.

    python examples/torch_train.py MOUNT --rank 0 --iterations 20 --checkpoint ckpt.pt
    # resumed by a job with 3 data-parallel ranks instead of the mount's layout:
    python examples/torch_train.py MOUNT --rank 0 --data-parallel-size 3 --checkpoint ckpt.pt

Each step reads the micro-batch Megatron's DataLoader would give this rank
(mmfs.adapters.torch.RankStream: tokens, labels, loss_mask, position_ids, read by
DataLoader workers), trains a toy model on it and, every --save-every steps, saves
the model and the stream's state_dict (Megatron's consumed_samples: all ranks'
samples so far). Run it again with the same --checkpoint and it reads on from
exactly where it stopped; with another --data-parallel-size or --micro-batch-size it
reads what Megatron's sampler, rebuilt on that layout at that consumed_samples,
gives the rank: the files of MOUNT/<split>/streams/dp=D,mbs=M,from=C/RRR/
(docs/streams.md). torch is only needed here; mmfs.loader itself is numpy only.
"""

from __future__ import annotations

import argparse
import os

import torch

from mmfs.adapters.torch import RankStream
from mmfs.loader import Mount


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mount")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--split", default="train")
    parser.add_argument("--data-parallel-size", type=int, help="default: the mount's training: layout")
    parser.add_argument("--micro-batch-size", type=int, help="default: the mount's training: layout")
    parser.add_argument("--iterations", type=int, default=20, help="steps to run in this job")
    parser.add_argument("--checkpoint", default="mmfs-example-ckpt.pt")
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    args = parser.parse_args()

    mount = Mount(args.mount)
    stream = RankStream(mount, args.split, args.rank, data_parallel_size=args.data_parallel_size,
                        micro_batch_size=args.micro_batch_size)
    vocab = int(max(2**16, (mount.eod or 0) + 1)) if mount.dtype.itemsize <= 2 else 2**17
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        stream.load_state_dict(state["data"])
        print(f"resuming at consumed_samples {stream.state_dict()['consumed_samples']}")

    for step, batch in enumerate(stream.batches(num_workers=args.workers)):
        logits = model(batch["tokens"])
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                                   reduction="none")
        mask = batch["loss_mask"].flatten()
        loss = (losses * mask).sum() / mask.sum().clamp(min=1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"consumed_samples {stream.state_dict()['consumed_samples']} loss {loss.item():.4f} "
              f"samples {batch['sample_ids'].tolist()}")
        if (step + 1) % args.save_every == 0 or step + 1 == args.iterations:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "data": stream.state_dict()}, args.checkpoint)
        if step + 1 == args.iterations:
            break


if __name__ == "__main__":
    main()
