"""A PyTorch training loop over one data-parallel rank's stream of an mmfs mount,
resuming from the consumed_samples of its checkpoint, without Megatron.

    python examples/torch_train.py MOUNT --rank 0 --iterations 20 --checkpoint ckpt.pt

Each step reads the micro-batches Megatron's DataLoader would give this rank
(Mount.megatron_batches: tokens, labels, loss_mask, position_ids), trains a toy
model on them and, every --save-every steps, saves the model and consumed_samples
(Megatron's counter: all ranks' samples so far). Run it again with the same
--checkpoint and it reads on from exactly where it stopped. torch is only needed
here; mmfs.loader itself is numpy only.
"""

from __future__ import annotations

import argparse
import os

import torch

from mmfs.loader import Mount


class RankStream(torch.utils.data.IterableDataset):
    """The rank's micro-batches from consumed_samples, as torch tensors."""

    def __init__(self, mount: Mount, split: str, rank: int, consumed_samples: int) -> None:
        self.mount, self.split, self.rank, self.consumed = mount, split, rank, consumed_samples

    def __iter__(self):
        for batch in self.mount.megatron_batches(self.split, self.rank, self.consumed):
            yield {k: torch.from_numpy(v) for k, v in batch.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mount")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--split", default="train")
    parser.add_argument("--iterations", type=int, default=20, help="steps to run in this job")
    parser.add_argument("--checkpoint", default="mmfs-example-ckpt.pt")
    parser.add_argument("--save-every", type=int, default=5)
    args = parser.parse_args()

    mount = Mount(args.mount)
    t = mount.training
    if not t:
        raise SystemExit("the mount has no training section: add a training: block to its config")
    per_step = t["micro_batch_size"] * t["data_parallel_size"]  # one micro-batch per rank per step
    vocab = int(max(2**16, (mount.eod or 0) + 1)) if mount.dtype.itemsize <= 2 else 2**17
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    consumed = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        consumed = state["consumed_samples"]
        print(f"resuming at consumed_samples {consumed}")

    loader = torch.utils.data.DataLoader(RankStream(mount, args.split, args.rank, consumed), batch_size=None)
    for step, batch in enumerate(loader):
        if step == args.iterations:
            break
        logits = model(batch["tokens"])
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                                   reduction="none")
        mask = batch["loss_mask"].flatten()
        loss = (losses * mask).sum() / mask.sum().clamp(min=1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        consumed += per_step
        print(f"consumed_samples {consumed} loss {loss.item():.4f} first tokens {batch['tokens'][0, :4].tolist()}")
        if (step + 1) % args.save_every == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "consumed_samples": consumed}, args.checkpoint)


if __name__ == "__main__":
    main()
