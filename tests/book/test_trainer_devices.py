"""Chapter 10's facts about its trainers, checked against the installed Lightning and
Accelerate on a machine without a GPU: CUDA is faked with four devices where a row of the
chapter's table needs GPUs (the Trainer only parses and places devices here; nothing runs),
and an Accelerate state, once made, cannot change within a process."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import textwrap
import warnings
from typing import TYPE_CHECKING
from unittest import mock

import accelerate.state as accelerate_state
import pytest
import torch

if TYPE_CHECKING:
    import lightning as L


def lightning():
    """Lightning, imported by the tests that use it, not at collection: its import takes
    seconds, paid by every test process that collects this file. Pinned in requirements.txt
    with Accelerate: a missing one fails, never skips."""
    import lightning as L

    return L

FAKE_GPUS = 4


@contextlib.contextmanager
def fake_cuda(count: int = FAKE_GPUS):
    """torch and Lightning both see ``count`` CUDA devices (and no Apple GPU)."""
    import lightning.fabric.accelerators.cuda as fabric_cuda
    import lightning.fabric.accelerators.mps as fabric_mps

    with mock.patch.object(fabric_cuda, "num_cuda_devices", return_value=count), \
            mock.patch.object(fabric_mps.MPSAccelerator, "is_available", return_value=False), \
            mock.patch.object(torch.cuda, "is_available", return_value=True), \
            mock.patch.object(torch.cuda, "device_count", return_value=count):
        yield


def trainer(**kwargs) -> L.Trainer:
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lightning().Trainer(logger=False, enable_checkpointing=False, **kwargs)


# The chapter's table: what you want -> the arguments -> what Lightning makes of them.
TABLE = [
    ({"accelerator": "cpu"}, "CPUAccelerator", [0], "SingleDeviceStrategy"),
    ({"accelerator": "cuda", "devices": [1]}, "CUDAAccelerator", [1], "SingleDeviceStrategy"),
    ({"accelerator": "gpu", "devices": 1}, "CUDAAccelerator", [0], "SingleDeviceStrategy"),
    ({"accelerator": "gpu", "devices": 2}, "CUDAAccelerator", [0, 1], "DDPStrategy"),
    ({"accelerator": "gpu", "devices": -1}, "CUDAAccelerator", list(range(FAKE_GPUS)),
     "DDPStrategy"),
    ({"accelerator": "auto"}, "CUDAAccelerator", list(range(FAKE_GPUS)), "DDPStrategy"),
]


@pytest.mark.parametrize(("arguments", "accelerator", "device_ids", "strategy"), TABLE,
                         ids=[str(row[0]) for row in TABLE])
def test_the_lightning_devices_table_in_a_script(arguments, accelerator, device_ids, strategy):
    with fake_cuda():
        t = trainer(**arguments)
    assert type(t.accelerator).__name__ == accelerator
    assert t.device_ids == device_ids
    assert type(t.strategy).__name__ == strategy


def test_devices_auto_in_a_notebook_takes_one_gpu_and_several_devices_fork():
    import lightning.pytorch.trainer.connectors.accelerator_connector as connector

    with fake_cuda(), mock.patch.object(connector, "_IS_INTERACTIVE", True):
        auto = trainer(accelerator="gpu", devices="auto")
        two = trainer(accelerator="gpu", devices=2)
    assert auto.device_ids == [0] and type(auto.strategy).__name__ == "SingleDeviceStrategy"
    assert two.device_ids == [0, 1]
    assert two.strategy.launcher._start_method == "fork", "ddp_fork, chosen for the notebook"


def test_auto_takes_the_cpu_where_there_is_no_gpu():
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has a GPU")
    assert type(trainer(accelerator="auto", devices=1).accelerator).__name__ == "CPUAccelerator"


def test_gpus_argument_is_gone():
    with pytest.raises(TypeError, match="gpus"):
        lightning().Trainer(gpus=1)


def test_accelerate_names_one_process_device_without_an_index():
    """Accelerate's default device (one process) is the bare type: torch.device("cuda") on a
    CUDA machine, which is not equal to the cuda:0 its tensors report."""
    state = accelerate_state.PartialState
    with mock.patch.object(accelerate_state, "is_mps_available", return_value=False), \
            mock.patch.object(torch.cuda, "is_available", return_value=True):
        cuda = state.default_device.fget(None)
    assert cuda == torch.device("cuda") and cuda.index is None
    assert cuda != torch.device("cuda:0")


def test_accelerate_prepared_loaders_copy_blocking_by_default():
    from accelerate.utils import DataLoaderConfiguration

    assert DataLoaderConfiguration().non_blocking is False


def test_an_accelerate_state_cannot_change_within_a_process() -> None:
    """Why chapter 10 runs the CPU, mixed-precision and two-process cases as scripts."""
    code = textwrap.dedent("""
        from accelerate import Accelerator
        Accelerator()
        try:
            Accelerator(mixed_precision="bf16")
        except ValueError as exc:
            print("refused:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "refused: AcceleratorState has already been initialized and cannot be changed" in out.stdout
