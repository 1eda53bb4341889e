"""The troubleshooting page (chapter 9) quotes PyTorch's messages word for word.

Each message that can be produced on a machine without a GPU is produced here with the
installed PyTorch and looked up in the page's code blocks; GPU-only messages are checked
against the text compiled into the installed PyTorch libraries.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torchmetrics
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "chapters" / "09_troubleshooting.md"
TORCH_LIB = Path(torch.__file__).parent / "lib"


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


@pytest.fixture(scope="module")
def quoted() -> list[str]:
    """Every fenced code block of the page, trailing spaces removed."""
    blocks = re.findall(r"```text\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert blocks, "the page quotes its messages in ```text blocks"
    return [_normalise(b) for b in blocks]


def _raised(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def _line(exc: BaseException) -> str:
    """The last line of a traceback: ``ErrorType: message``."""
    return _normalise(f"{type(exc).__name__}: {exc}")


def _assert_quoted(quoted: list[str], text: str) -> None:
    assert _normalise(text) in quoted, f"the page does not quote exactly:\n{text}"


def _in_library(name: str, *fragments: str) -> None:
    path = TORCH_LIB / name
    if not path.exists():
        pytest.skip(f"{name} is not part of this PyTorch build")
    data = path.read_bytes()
    for fragment in fragments:
        assert fragment.encode() in data, f"{fragment!r} is not in {name}"


META = torch.device("meta")


def test_rnn_hidden_state_on_another_device(quoted):
    rnn = nn.RNN(10, 5).to(META)
    exc = _raised(lambda: rnn(torch.randn(4, 3, 10, device=META), torch.zeros(1, 3, 5)))
    _assert_quoted(quoted, _line(exc))
    # The GPU wording is the same sentence with the GPU's name in place of meta.
    _assert_quoted(quoted, _line(exc).replace("meta", "cuda:0"))


def test_rnn_input_on_another_device_than_the_parameters(quoted):
    rnn = nn.RNN(10, 5).to(META)
    exc = _raised(lambda: rnn(torch.randn(4, 3, 10)))
    _assert_quoted(quoted, _line(exc).replace("meta", "cuda:0"))


@pytest.mark.parametrize("first", ["cpu", "meta"])
def test_tensor_not_on_the_expected_device(quoted, first):
    second = "meta" if first == "cpu" else "cpu"
    exc = _raised(lambda: torch.ones(3, device=second) + torch.ones(3, device=first))
    _assert_quoted(quoted, _line(exc))


def test_same_device_message_as_a_gpu_prints_it(quoted):
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Fake tensors mirror PyTorch's device check, with a CUDA device on any machine.
    with FakeTensorMode():
        a, b = torch.empty(3, device="cuda"), torch.empty(3)
        exc = _raised(lambda: a + b)
    _assert_quoted(quoted, f"RuntimeError: {exc}")
    # ... and the compiled check prints the same sentence.
    _in_library("libtorch_cpu.so",
                "Expected all tensors to be on the same device, but found at least two devices, ")


def test_same_device_message_naming_the_argument(quoted):
    text = ("RuntimeError: Expected all tensors to be on the same device, but got mat1 is on cpu, "
            "different from other tensors on cuda:0 (when checking argument in method "
            "wrapper_CUDA_addmm)")
    _assert_quoted(quoted, text)
    _in_library("libtorch_cpu.so", "Expected all tensors to be on the same device, but got ",
                ", different from other tensors on ", " (when checking argument in method ")


def test_convolution_input_and_weight_type(quoted):
    page = PAGE.read_text()
    assert ("Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be "
            "the same or input should be a MKLDNN tensor and weight is a dense tensor") in page
    _in_library("libtorch_cpu.so", "Input type (",
                ") should be the same or input should be a MKLDNN tensor and weight is a dense tensor")


def test_numpy_of_a_device_tensor(quoted):
    exc = _raised(lambda: torch.ones(2, device=META).numpy())
    _assert_quoted(quoted, _line(exc).replace("meta", "cuda:0"))


def test_moving_a_meta_module(quoted):
    exc = _raised(lambda: nn.Linear(2, 1).to(META).to("cpu"))
    _assert_quoted(quoted, _line(exc))


def test_cuda_checkpoint_on_a_machine_without_cuda(quoted, tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA, so the checkpoint would load")
    import torch.serialization as serialization

    # Write the file a GPU would write: its storages are tagged with the device cuda:0.
    path = tmp_path / "gpu.pt"
    with monkeypatch.context() as m:
        m.setattr(serialization, "location_tag", lambda storage: "cuda:0")
        torch.save({"w": torch.ones(2)}, path)
    exc = _raised(lambda: torch.load(path, weights_only=True))
    _assert_quoted(quoted, _line(exc))
    assert torch.equal(torch.load(path, map_location="cpu", weights_only=True)["w"], torch.ones(2))


def test_module_prefix_in_a_state_dict(quoted):
    wrapped = nn.DataParallel(nn.Linear(2, 1))
    exc = _raised(lambda: nn.Linear(2, 1).load_state_dict(wrapped.state_dict()))
    _assert_quoted(quoted, _line(exc))


def test_no_nvidia_driver(quoted):
    if torch.cuda.is_available() or not torch.version.cuda:
        pytest.skip("needs a CUDA build of PyTorch on a machine without a GPU")
    exc = _raised(lambda: torch.zeros(1, device="cuda"))
    if "NVIDIA driver" not in str(exc):
        pytest.skip(f"this machine has a driver but no GPU: {exc}")
    _assert_quoted(quoted, _line(exc))


def test_torch_not_compiled_with_cuda(quoted):
    source = (Path(torch.__file__).parent / "cuda" / "__init__.py").read_text()
    assert 'AssertionError("Torch not compiled with CUDA enabled")' in source
    _assert_quoted(quoted, "AssertionError: Torch not compiled with CUDA enabled")


def test_torchmetrics_device_message(quoted):
    class Failing(torchmetrics.classification.MulticlassAccuracy):
        def update(self, preds, target):
            # What PyTorch raises inside update() when the state and the input disagree.
            raise RuntimeError("Expected all tensors to be on the same device, but found at "
                               "least two devices, cuda:0 and cpu!")

    Failing.__name__ = "MulticlassAccuracy"
    metric = Failing(num_classes=3)
    exc = _raised(lambda: metric.update(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)))
    _assert_quoted(quoted, _line(exc))


def test_cuda_out_of_memory(quoted):
    oom = next(b for b in quoted if "CUDA out of memory" in b)
    assert oom.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ")
    assert issubclass(torch.cuda.OutOfMemoryError, RuntimeError)
    assert torch.OutOfMemoryError is torch.cuda.OutOfMemoryError
    _in_library("libc10_cuda.so", "CUDA out of memory. Tried to allocate ", ". GPU ",
                " has a total capacity of ", " of which ", " memory in use. ",
                "Of the allocated memory ", " is allocated by PyTorch, ",
                " is reserved by PyTorch but unallocated.",
                "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
                "expandable_segments:True to avoid fragmentation.  See documentation for Memory "
                "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
                "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")


def test_links_point_to_chapters_that_exist():
    links = re.findall(r"\]\(([^)]+\.(?:ipynb|md))\)", PAGE.read_text())
    assert links
    toc = (ROOT / "_toc.yml").read_text()
    for link in set(links):
        assert f"chapters/{Path(link).stem}" in toc, f"{link} is not in the table of contents"
