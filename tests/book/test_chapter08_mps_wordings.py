"""Chapter 8's device-mismatch check accepts every device's wording, mps included.

The Linux wheels carry no mps code, so the mps wordings are the templates of torch's
sources (2.14): aten/src/ATen/native/mps/operations/Linear.mm, ``_mps_linear``:
``"Tensor for argument weight is on ", weight_arg.device(), " but expected on mps"`` (and
the same for ``input`` and ``bias``), which ``nn.Linear`` reaches on mps; and
aten/src/ATen/native/mps/OperationUtils.mm, ``Placeholder::Placeholder``:
``"Placeholder storage has not been allocated on MPS device!"``, raised for any CPU tensor
fed to an MPSGraph kernel, such as a loss's CPU class weights.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from tests.conftest import ROOT

NOTEBOOK = ROOT / "chapters" / "08_device_pitfalls.ipynb"


@pytest.fixture(scope="module")
def is_device_mismatch():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (source,) = ["".join(c["source"]) for c in cells
                 if "def is_device_mismatch" in "".join(c["source"])]
    assert "remove-cell" in next(c for c in cells if "def is_device_mismatch"
                                 in "".join(c["source"]))["metadata"]["tags"]
    namespace: dict = {}
    exec(compile(source, "is_device_mismatch", "exec"), namespace)
    return namespace["is_device_mismatch"]


def _mps_linear(arg: str, device: str) -> str:
    return f"Tensor for argument {arg} is on {device} but expected on mps"


MISMATCHES = [
    # CUDA (TensorIterator and the addmm argument check)
    "Expected all tensors to be on the same device, but found at least two devices, "
    "cuda:0 and cpu!",
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 "
    "and cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)",
    "Expected all tensors to be on the same device, but found at least two devices, "
    "mps:0 and cpu!",
    # meta
    "Tensor on device cpu is not on the expected device meta!",
    # nn.RNN
    "Input and hidden tensors are not at the same device, found input tensor at mps:0 and "
    "hidden tensor at cpu",
    # mps: the LayerInForward and PlainList traps (a CPU nn.Linear fed an mps tensor)
    _mps_linear("weight", "cpu"),
    _mps_linear("input", "cpu"),
    _mps_linear("bias", "cpu"),
    # mps: the loss with CPU class weights
    "Placeholder storage has not been allocated on MPS device!",
]

NOT_MISMATCHES = [
    "MPS device does not support linear for non-float inputs",
    "mat1 and mat2 shapes cannot be multiplied (4x8 and 16x2)",
    "expected scalar type Float but found Double",
    "Placeholder tensor is empty!",
    "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.",
]


@pytest.mark.parametrize("message", MISMATCHES)
def test_every_device_wording_is_a_mismatch(is_device_mismatch, message):
    assert is_device_mismatch(message)


@pytest.mark.parametrize("message", NOT_MISMATCHES)
def test_other_errors_are_not(is_device_mismatch, message):
    assert not is_device_mismatch(message)


def test_the_meta_traps_here_match(is_device_mismatch):
    """The wordings the chapter meets on this machine (meta) pass the same check."""
    meta = torch.device("meta")
    for fn in (lambda: nn.Linear(16, 2)(torch.randn(4, 16, device=meta)),
               lambda: nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 0.5]))(
                   torch.randn(6, 3, device=meta), torch.zeros(6, dtype=torch.long,
                                                              device=meta))):
        with pytest.raises(RuntimeError) as caught:
            fn()
        assert is_device_mismatch(str(caught.value)), str(caught.value)
