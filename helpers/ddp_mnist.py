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

Chapter 5's lessons apply: each process keeps the data as two tensors on its own device and
takes a batch by indexing them with the sampler's indices (no per-sample collation, no copy
per step), and the running loss is summed on the device and reduced once per epoch.
Chapter 5's split holds too: the last ``MNIST_VAL_SIZE`` training images are held out for
validation (``mnist_split``), and the 10,000 test images are never looked at. Validation
shards its images without padding, so every image is scored exactly once whatever the
number of processes.

From a notebook, :func:`helpers.launch.run_ddp` launches this script with a time limit and
streams its output, and ``spawn_demo`` is an importable function for
``torch.multiprocessing.spawn``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

from .checkpoints import save_checkpoint
from .data import MNIST_VAL_SIZE, mnist_tensors
from .models import MnistCNN

__all__ = ["CHECKPOINT_NAME", "SUMMARY_NAME", "main", "mnist_split", "parse_args", "spawn_demo",
           "weights_fingerprint"]

CHECKPOINT_NAME = "mnist_ddp.pt"
SUMMARY_NAME = "summary.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The script's options from ``argv`` (default ``sys.argv[1:]``), checked (chapter 7)."""
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
                        help=f"use only the first N of the {MNIST_VAL_SIZE} held-out "
                             "validation images")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ddp-facts", action="store_true",
                        help="gloo only: after training, every rank loads rank 0's checkpoint "
                             "and records DDP's buffer broadcast and SyncBatchNorm's refusal "
                             "of the CPU in its rank<N>.json (what spawn_demo records)")
    parser.add_argument("--out", type=Path, default=Path("runs/ddp_mnist"),
                        help="folder for the checkpoint, summary.json and rank<N>.json")
    if isinstance(argv, (str, bytes)):
        raise TypeError(f"argv must be a list of arguments such as ['--epochs', '2'], got the "
                        f"string {argv!r} (split it with shlex.split)")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1:
        parser.error("--epochs and --batch-size must be at least 1, got "
                     f"{args.epochs} and {args.batch_size}")
    for name in ("train_subset", "val_subset"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got "
                         f"{getattr(args, name)}")
    if not math.isfinite(args.lr) or args.lr <= 0:
        parser.error(f"--lr must be a positive learning rate such as 0.05, got {args.lr}")
    for name in ("momentum", "dropout"):
        if not 0 <= getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 0 and below 1, got {getattr(args, name)}")
    if args.ddp_facts and args.backend == "nccl":
        parser.error("--ddp-facts records what gloo does on the CPU: use it with --backend gloo")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file: give a folder for the checkpoint and "
                     "the result files")
    return args


def mnist_split(device: torch.device | str = "cpu", *, train_subset: int | None = None,
                val_subset: int | None = None,
                ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Chapter 5's split as tensors on ``device`` (chapter 7): ``(train_x, train_y), (val_x,
    val_y)``, where validation is the last ``MNIST_VAL_SIZE`` of MNIST's 60,000 training
    images and training the rest, so the test images stay unseen. ``train_subset`` /
    ``val_subset`` keep the first N images of each part, as ``mnist_loaders`` does."""
    for name, value in (("train_subset", train_subset), ("val_subset", val_subset)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be a whole number of images (or None for all), "
                            f"got {value!r} ({type(value).__name__})")
        if value < 1:
            raise ValueError(f"{name} must be at least 1 image (or None for all), got {value}")
    images, labels = mnist_tensors(train=True, device=device)
    n_train = len(labels) - MNIST_VAL_SIZE
    n_val = MNIST_VAL_SIZE if val_subset is None else min(val_subset, MNIST_VAL_SIZE)
    if train_subset is not None:
        n_train = min(train_subset, n_train)
    start = len(labels) - MNIST_VAL_SIZE
    return ((images[:n_train], labels[:n_train]),
            (images[start:start + n_val], labels[start:start + n_val]))


def weights_fingerprint(model: nn.Module) -> dict[str, float | str]:
    """SHA-256 of every parameter's bytes (on the CPU) and their sum: equal fingerprints
    mean bit-for-bit equal weights (chapter 7)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"weights_fingerprint takes an nn.Module, got {type(model).__name__}: "
                        "load a state_dict into its model first (model.load_state_dict)")
    on_meta = [name for name, p in model.named_parameters() if p.is_meta]
    if on_meta:
        raise ValueError(f"{on_meta[0]} (and {len(on_meta) - 1} more) is on the meta device, "
                         "which holds no values to fingerprint: give the model real weights "
                         "first (model.to_empty(device=...) and load_state_dict)")
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
    """Train the MNIST CNN with DDP in each process torchrun starts (chapter 7)."""
    args = parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("run this script with torchrun, for example: "
                         "torchrun --standalone --nproc-per-node 2 -m helpers.ddp_mnist")
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    backend = args.backend or (
        "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo")
    if backend == "nccl" and args.ddp_facts:
        raise SystemExit("--ddp-facts records what gloo does on the CPU: use --backend gloo")
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
        try:  # before training, not after it: a bad --out must not cost a run
            out.mkdir(parents=True, exist_ok=True)
            (out / f".rank{rank}-write-test").touch()
            (out / f".rank{rank}-write-test").unlink()
        except OSError as err:
            raise SystemExit(f"cannot write into --out {out} ({err.strerror}): give a folder "
                             "you can write") from None
        _log(rank, f"{world} processes, backend {backend}, each on {device.type}; "
                   f"batch {args.batch_size} per process = {args.batch_size * world} per step")

        # Rank 0 reads (or, on Colab, downloads) MNIST first; the others wait, then read the
        # files it left, so no two processes ever download to the same folder at once.
        if rank != 0:
            dist.barrier()
        # The whole (small) data set lives on this process's device, as in chapter 5: a batch
        # is one indexing operation, with no per-sample collation and no copy per step.
        (images, labels), (val_images, val_labels) = mnist_split(
            device, train_subset=args.train_subset, val_subset=args.val_subset)
        if rank == 0:
            dist.barrier()
        train_set = TensorDataset(images, labels)

        # Every process must start from the same weights; DDP also broadcasts rank 0's
        # weights when it wraps the model, so this is belt and braces.
        torch.manual_seed(args.seed)
        model = MnistCNN(dropout=args.dropout).to(device)
        ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
        # After that, each rank draws its own dropout masks.
        torch.manual_seed(args.seed + 1 + rank)

        sampler = DistributedSampler(train_set, num_replicas=world, rank=rank,
                                     shuffle=True, seed=args.seed)
        # Validation needs no shuffle and no equal shard sizes: rank r scores images r,
        # r + world, r + 2 world, ..., so each image is counted once. (DistributedSampler
        # would pad the shards to equal length with repeated images whenever the world
        # size does not divide the number of images, and count those twice.)
        val_index = torch.arange(rank, len(val_labels), world, device=device)

        optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
        loss_fn = nn.CrossEntropyLoss()
        fork_devices = [device.index] if device.type == "cuda" else []

        history, seen_indices, grad_check = [], [], None
        start = time.perf_counter()
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            order = list(iter(sampler))
            seen_indices.append(order)
            # One copy of this epoch's indices to the device; every batch is a slice of it.
            batches = torch.tensor(order, device=device).split(args.batch_size)
            ddp.train()
            loss_sum = torch.zeros((), device=device, dtype=torch.float64)
            examples = 0
            for step, index in enumerate(batches):
                x, y = images[index], labels[index]
                if epoch == 0 and step == 0:
                    grad_check = _check_gradient_averaging(ddp, loss_fn, x, y, world,
                                                           fork_devices)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(ddp(x), y)
                loss.backward()  # DDP all-reduces (averages) the gradients here
                optimizer.step()
                # Summed on the device in one in-place kernel: no host synchronisation.
                loss_sum.add_(loss.detach(), alpha=len(y))
                examples += len(y)
            totals = torch.stack([loss_sum, loss_sum.new_tensor(examples)])
            dist.all_reduce(totals)  # once per epoch: the mean loss over every rank's examples
            val_acc, val_counted = _distributed_accuracy(model, val_images, val_labels,
                                                         val_index)
            row = {"epoch": epoch + 1, "train_loss": (totals[0] / totals[1]).item(),
                   "val_acc": val_acc, "val_counted": val_counted, "steps": len(batches)}
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
                   "train_examples": len(train_set), "val_examples": len(val_labels),
                   "lr": args.lr, "momentum": args.momentum, "dropout": args.dropout,
                   "seed": args.seed, "seconds": seconds, "history": history,
                   "checkpoint": CHECKPOINT_NAME}
        if args.ddp_facts:  # after the barrier: rank 0's checkpoint is complete
            dist.barrier()
            report["ddp_facts"] = {"loaded": _load_everywhere(out / CHECKPOINT_NAME, rank,
                                                              device),
                                   **_buffer_and_sync_bn_facts(rank)}
            (out / f"rank{rank}.json").write_text(json.dumps(report))
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
def _distributed_accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                          index: torch.Tensor, batch_size: int = 1000) -> tuple[float, int]:
    """Each rank scores the images in ``index``; one all-reduce adds up the counts.

    The plain module is used, not the DDP wrapper: the ranks may run different numbers of
    batches here, and DDP's forward can start a collective (the buffer broadcast) that would
    wait for ranks that have already finished.
    """
    model.eval()
    correct = torch.zeros((), device=images.device, dtype=torch.int64)
    for batch in index.split(batch_size):
        correct += (model(images[batch]).argmax(dim=1) == labels[batch]).sum()
    counts = torch.stack([correct, correct.new_tensor(len(index))])
    dist.all_reduce(counts)
    right, total = counts.tolist()
    return right / total, total


# ---------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------
# torch.multiprocessing.spawn needs a function it can import by name in the new processes:
# one defined in a notebook cannot be, one in this module can.

def spawn_demo(rank: int, world: int, init_file: str, out: str) -> None:
    """One rank of chapter 7's ``mp.spawn`` demonstration, on the CPU over gloo.

    Writes ``spawn<rank>.json`` in ``out`` with what it saw: (1) rank 0 saves a checkpoint,
    a barrier, every rank loads it with its own ``map_location``; (2) DDP broadcasts rank 0's
    buffers at the start of every training forward; (3) ``SyncBatchNorm`` conversion.
    """
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        report: dict = {"rank": rank, "world_size": dist.get_world_size()}
        here = torch.device("cpu")  # on GPUs: torch.device("cuda", local_rank)

        # (1) Save on rank 0, wait, load everywhere.
        torch.manual_seed(rank)  # deliberately different weights on every rank
        model = MnistCNN()
        path = Path(out) / "spawn_checkpoint.pt"
        if rank == 0:
            torch.save(model.state_dict(), path)
        dist.barrier()  # no rank reads before rank 0 has finished writing
        model.load_state_dict(torch.load(path, map_location=here, weights_only=True))
        report["loaded"] = weights_fingerprint(model)
        report.update(_buffer_and_sync_bn_facts(rank))
        (Path(out) / f"spawn{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def _load_everywhere(path: Path, rank: int, device: torch.device) -> dict:
    """Every rank loads the checkpoint rank 0 wrote (after a barrier) with ``map_location``
    set to its own device, into a model that starts from weights of its own."""
    torch.manual_seed(rank)  # deliberately different weights on every rank
    model = MnistCNN().to(device)
    before = weights_fingerprint(model)
    state = torch.load(path, map_location=device, weights_only=True)["model"]
    model.load_state_dict(state)
    return {"before": before, "after": weights_fingerprint(model),
            "devices": sorted({str(t.device) for t in state.values()})}


def _buffer_and_sync_bn_facts(rank: int) -> dict:
    """In a gloo group already joined: what DDP does with BatchNorm's buffers, and
    SyncBatchNorm's refusal of CPU tensors (chapter 7; ``spawn_demo`` and ``--ddp-facts``)."""
    report: dict = {}
    # (2) Buffers: each rank feeds data with its own mean, so BatchNorm's running mean
    # drifts apart; a pre-hook on the inner module sees what DDP hands it.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    seen: list[list[float]] = []
    net.register_forward_pre_hook(lambda m, args: seen.append(m[1].running_mean.tolist()))
    ddp = DDP(net)
    after: list[list[float]] = []
    for step in range(3):
        x = torch.randn(16, 4) + 10.0 * rank + step
        ddp(x).sum().backward()
        after.append(net[1].running_mean.tolist())
    report["running_mean_at_forward_start"] = seen
    report["running_mean_after_forward"] = after

    # (3) SyncBatchNorm replaces every BatchNorm layer; its statistics are computed over
    # all ranks' batches, which needs CUDA (or XPU) tensors: CPU and mps ones are refused.
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Linear(4, 4),
                                                                 nn.BatchNorm1d(4)))
    report["sync_bn_type"] = type(sync[1]).__name__
    try:
        sync(torch.randn(8, 4))
        report["sync_bn_cpu_error"] = None
    except ValueError as err:
        report["sync_bn_cpu_error"] = str(err)
    return report


if __name__ == "__main__":
    main()
