"""Bad input for chapter 7's DDP script (helpers.ddp_mnist): each case ends in a clear
error naming the bad value and what to do, or in a correct result."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import ddp_mnist
from helpers.models import MnistCNN
from tests.support import assert_clear_error, assert_mentions

# (argv, words the error must contain)
BAD_ARGS = [
    (["--epochs", "0"], ["--epochs", "at least 1", "0"]),
    (["--epochs", "-1"], ["--epochs", "-1"]),
    (["--epochs", "two"], ["--epochs", "invalid int value", "'two'"]),
    (["--batch-size", "0"], ["--batch-size", "at least 1"]),
    (["--train-subset", "0"], ["--train-subset", "at least 1", "0"]),
    (["--val-subset", "-5"], ["--val-subset", "-5"]),
    (["--lr", "0"], ["--lr", "positive", "0.0"]),
    (["--lr", "nan"], ["--lr", "nan"]),
    (["--lr", "-0.1"], ["--lr", "-0.1"]),
    (["--momentum", "1"], ["--momentum", "below 1", "1.0"]),
    (["--dropout", "-0.1"], ["--dropout", "-0.1"]),
    (["--backend", "mpi"], ["--backend", "'mpi'", "gloo", "nccl"]),
    (["--backend", "NCCL"], ["--backend", "'NCCL'"]),
    (["--no-such-option"], ["unrecognized arguments", "--no-such-option"]),
]


@pytest.mark.parametrize(("argv", "words"), BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_parse_args_refuses(argv, words, capsys):
    with pytest.raises(SystemExit) as caught:
        ddp_mnist.parse_args(argv)
    assert caught.value.code == 2
    assert_mentions(capsys.readouterr().err, words)  # argparse prints its message


def test_parse_args_out_is_a_file(tmp_path, capsys):
    f = tmp_path / "out"
    f.write_text("")
    with pytest.raises(SystemExit):
        ddp_mnist.parse_args(["--out", str(f)])
    assert f"--out {f} is a file: give a folder" in capsys.readouterr().err


def test_parse_args_a_string_instead_of_a_list():
    with pytest.raises(TypeError, match=r"list of arguments.*'--epochs 2'.*shlex.split"):
        ddp_mnist.parse_args("--epochs 2")


def test_parse_args_good_values():
    args = ddp_mnist.parse_args(["--epochs", "2", "--lr", "0.1", "--momentum", "0",
                                 "--dropout", "0", "--out", "a/new/folder"])
    assert (args.epochs, args.lr, args.momentum, args.dropout) == (2, 0.1, 0.0, 0.0)
    assert args.out == Path("a/new/folder") and not args.out.exists(), "parsing writes nothing"


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"train_subset": 0}, ValueError, ["train_subset", "at least 1", "0"]),
    ({"train_subset": -1}, ValueError, ["train_subset", "-1"]),
    ({"val_subset": 0}, ValueError, ["val_subset", "0"]),
    ({"train_subset": 10.5}, TypeError, ["train_subset", "10.5", "whole number"]),
    ({"val_subset": "7"}, TypeError, ["val_subset", "'7'"]),
    ({"train_subset": True}, TypeError, ["train_subset", "True"]),
    ({"device": "gpu"}, (ValueError, RuntimeError), ["gpu"]),
])
def test_mnist_split_refuses(kwargs, error, words):
    assert_clear_error(lambda: ddp_mnist.mnist_split(**kwargs), error, words)


def test_mnist_split_caps_subsets_at_what_exists():
    from helpers.data import MNIST_VAL_SIZE

    (tx, _), (vx, _) = ddp_mnist.mnist_split(train_subset=10**9, val_subset=10**9)
    assert len(vx) == MNIST_VAL_SIZE and len(tx) == 60_000 - MNIST_VAL_SIZE


@pytest.mark.parametrize(("model", "error", "words"), [
    (MnistCNN().state_dict(), TypeError, ["nn.Module", "OrderedDict", "load_state_dict"]),
    (torch.zeros(3), TypeError, ["nn.Module", "Tensor"]),
    (None, TypeError, ["NoneType"]),
    (nn.Linear(2, 2, device="meta"), ValueError, ["weight", "meta device", "to_empty"]),
])
def test_weights_fingerprint_refuses(model, error, words):
    assert_clear_error(lambda: ddp_mnist.weights_fingerprint(model), error, words)


def test_weights_fingerprint_correct_results():
    empty = ddp_mnist.weights_fingerprint(nn.ReLU())  # no parameters: a fingerprint still
    assert empty["sum"] == 0.0 and len(empty["sha256"]) == 64
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    # bfloat16 weights are fingerprinted through float32, the same way every time
    half = ddp_mnist.weights_fingerprint(model.to(torch.bfloat16))
    assert half == ddp_mnist.weights_fingerprint(model)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_main_refuses_an_unwritable_out_before_training(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(name, value)
    trained = []
    monkeypatch.setattr(ddp_mnist, "mnist_split", lambda *a, **k: trained.append(1))
    with pytest.raises(SystemExit, match=r"cannot write into --out .*file/sub"):
        ddp_mnist.main(["--backend", "gloo", "--out", str(tmp_path / "file" / "sub")])
    assert trained == [], "refused before reading any data"
    assert not torch.distributed.is_initialized(), "the process group was destroyed"
