"""Train the book's MNIST CNN with DistributedDataParallel (chapter 7, Data parallelism).

Launch one process per device with ``torchrun``; it sets RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT for every process, which ``init_process_group`` reads::

    # two processes on the CPU, talking over the gloo backend (any machine)
    torchrun --standalone --nproc-per-node 2 -m helpers.ddp_mnist --backend gloo --out runs/ddp

    # one process per GPU, talking over NCCL (a machine with several GPUs)
    torchrun --standalone --nproc-per-node gpu -m helpers.ddp_mnist --backend nccl --out runs/ddp

Every process builds the same model, sees its own shard of each epoch's shuffled data
(``DistributedSampler``, reshuffled by ``set_epoch``), and DDP averages the gradients
across processes during ``backward``, so every process takes the same optimizer step and
all of them hold identical weights throughout. Only rank 0 writes the checkpoint and the
summary; every rank writes ``rank<N>.json`` with a fingerprint of its final weights, so a
reader (and the book's tests) can check that the ranks agree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from .checkpoints import save_checkpoint
from .data import mnist_tensors
from .models import MnistCNN

__all__ = ["CHECKPOINT_NAME", "SUMMARY_NAME", "main", "parse_args", "weights_fingerprint"]

CHECKPOINT_NAME = "mnist_ddp.pt"
SUMMARY_NAME = "summary.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m helpers.ddp_mnist",
        description="Train the MNIST CNN with DistributedDataParallel (chapter 7).",
    )
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                        help="gloo (CPU) or nccl (one GPU per process); default: nccl when "
                             "there is a GPU for every process, else gloo")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="examples per process per step; the global batch is this times "
                             "the number of processes")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--train-subset", type=int, default=None,
                        help="use only the first N training images (a quick CPU run)")
    parser.add_argument("--val-subset", type=int, default=None,
                        help="use only the first N test images for validation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/ddp_mnist"),
                        help="folder for the checkpoint, summary.json and rank<N>.json")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1:
        parser.error("--epochs and --batch-size must be at least 1")
    return args


def weights_fingerprint(model: nn.Module) -> dict[str, float | str]:
    """SHA-256 of every parameter's bytes (on the CPU) and their sum: equal fingerprints
    mean bit-for-bit equal weights (chapter 7)."""
    digest = hashlib.sha256()
    total = 0.0
    for name, p in model.named_parameters():
        data = p.detach().to("cpu", torch.float32).contiguous()
        digest.update(name.encode())
        digest.update(data.numpy().tobytes())
        total += data.double().sum().item()
    return {"sha256": digest.hexdigest(), "sum": total}


def _log(rank: int, message: str) -> None:
    if rank == 0:
        print(message, flush=True)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("run this script with torchrun, for example: "
                         "torchrun --standalone --nproc-per-node 2 -m helpers.ddp_mnist")
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    backend = args.backend or (
        "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise SystemExit("--backend nccl needs CUDA GPUs; use --backend gloo on the CPU")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # before init: NCCL binds each process to its GPU
    else:
        device = torch.device("cpu")
    # env:// (the default) reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from torchrun.
    if backend == "nccl":
        dist.init_process_group(backend, device_id=device)
    else:
        dist.init_process_group(backend)
    rank = dist.get_rank()
    out = args.out
    try:
        _log(rank, f"{world} processes, backend {backend}, each on {device.type}; "
                   f"batch {args.batch_size} per process = {args.batch_size * world} per step")

        # Rank 0 reads (or, on Colab, downloads) MNIST first; the others wait, then read the
        # files it left, so no two processes ever download to the same folder at once.
        if rank != 0:
            dist.barrier()
        images, labels = mnist_tensors(train=True, subset=args.train_subset)
        val_images, val_labels = mnist_tensors(train=False, subset=args.val_subset)
        if rank == 0:
            dist.barrier()
        train_set = TensorDataset(images, labels)
        val_set = TensorDataset(val_images, val_labels)

        # Every process must start from the same weights; DDP also broadcasts rank 0's
        # weights when it wraps the model, so this is belt and braces.
        torch.manual_seed(args.seed)
        model = MnistCNN(dropout=args.dropout).to(device)
        ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
        # After that, each rank draws its own dropout masks.
        torch.manual_seed(args.seed + 1 + rank)

        sampler = DistributedSampler(train_set, num_replicas=world, rank=rank,
                                     shuffle=True, seed=args.seed)
        loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
        val_sampler = DistributedSampler(val_set, num_replicas=world, rank=rank, shuffle=False)
        val_loader = DataLoader(val_set, batch_size=256, sampler=val_sampler)

        optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
        loss_fn = nn.CrossEntropyLoss()
        fork_devices = [device.index] if device.type == "cuda" else []

        history, seen_indices, grad_check = [], [], None
        start = time.perf_counter()
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            seen_indices.append(list(iter(sampler)))
            ddp.train()
            loss_sum = torch.zeros(2, device=device, dtype=torch.float64)  # [sum, count]
            for step, (x, y) in enumerate(loader):
                x, y = x.to(device), y.to(device)
                if epoch == 0 and step == 0:
                    grad_check = _check_gradient_averaging(ddp, loss_fn, x, y, world,
                                                           fork_devices)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(ddp(x), y)
                loss.backward()  # DDP all-reduces (averages) the gradients here
                optimizer.step()
                loss_sum += torch.stack([loss.detach().double() * len(y),
                                         torch.tensor(len(y), device=device, dtype=torch.float64)])
            dist.all_reduce(loss_sum)  # sum over ranks: the mean loss over every example
            val_acc = _distributed_accuracy(ddp, val_loader, device)
            row = {"epoch": epoch + 1, "train_loss": (loss_sum[0] / loss_sum[1]).item(),
                   "val_acc": val_acc, "steps": len(loader)}
            history.append(row)
            _log(rank, f"epoch {row['epoch']}: train loss {row['train_loss']:.4f}, "
                       f"val accuracy {val_acc:.4f} ({row['steps']} steps per process)")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start

        out.mkdir(parents=True, exist_ok=True)
        wrote_checkpoint = rank == 0
        if wrote_checkpoint:
            # save_checkpoint unwraps DDP: the file holds the plain model's keys.
            save_checkpoint(ddp, out / CHECKPOINT_NAME, epochs=args.epochs,
                            world_size=world, backend=backend)
        report = {"rank": rank, "world_size": world, "backend": backend,
                  "device": str(device), "wrote_checkpoint": wrote_checkpoint,
                  "weights": weights_fingerprint(model), "grad_check": grad_check,
                  "indices": seen_indices, "examples_per_epoch": len(seen_indices[0])}
        (out / f"rank{rank}.json").write_text(json.dumps(report))
        summary = {"world_size": world, "backend": backend, "device": device.type,
                   "batch_per_process": args.batch_size,
                   "global_batch": args.batch_size * world, "epochs": args.epochs,
                   "train_examples": len(train_set), "val_examples": len(val_set),
                   "lr": args.lr, "momentum": args.momentum, "dropout": args.dropout,
                   "seed": args.seed, "seconds": seconds, "history": history,
                   "checkpoint": CHECKPOINT_NAME}
        dist.barrier()  # every rank's file is written before rank 0 reports
        if rank == 0:
            (out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2))
            _log(rank, f"trained in {seconds:.1f} s; rank 0 wrote {out / CHECKPOINT_NAME}")
        return summary
    finally:
        dist.destroy_process_group()


def _check_gradient_averaging(ddp: DDP, loss_fn, x, y, world: int,
                              fork_devices: list[int]) -> dict[str, float]:
    """Compare DDP's gradient with one averaged by hand, on the first batch.

    Inside ``no_sync()`` DDP leaves each rank with its local gradient; all-reducing that and
    dividing by the number of processes must give what a normal ``backward`` produces.
    The random state is forked so both passes draw the same dropout masks.
    """
    with torch.random.fork_rng(devices=fork_devices):
        with ddp.no_sync():
            loss_fn(ddp(x), y).backward()
    local = [p.grad.detach().clone() for p in ddp.parameters()]
    ddp.zero_grad(set_to_none=True)
    loss_fn(ddp(x), y).backward()
    by_hand = [g.clone() for g in local]
    for g in by_hand:
        dist.all_reduce(g)
        g /= world
    max_diff = max((a - p.grad).abs().max().item() for a, p in zip(by_hand, ddp.parameters(),
                                                                    strict=True))
    local_vs_ddp = max((a - p.grad).abs().max().item() for a, p in zip(local, ddp.parameters(),
                                                                       strict=True))
    ddp.zero_grad(set_to_none=True)
    return {"max_diff_ddp_vs_hand_average": max_diff, "max_diff_ddp_vs_local": local_vs_ddp}


@torch.no_grad()
def _distributed_accuracy(ddp: DDP, loader: DataLoader, device: torch.device) -> float:
    """Each rank scores its shard; an all-reduce adds up the counts."""
    ddp.eval()
    counts = torch.zeros(2, device=device, dtype=torch.float64)  # [correct, total]
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        counts[0] += (ddp(x).argmax(dim=1) == y).sum()
        counts[1] += len(y)
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


if __name__ == "__main__":
    main()
