"""fp16 is measured where it is a GPU's only tensor-core format (chapter 3): on Volta and
Turing (compute capability 7.x, such as Colab's T4), so the chapter's comparison of number
formats is not empty there. Stand-in CUDA backends play the GPUs; every question is asked about
the named GPU, not the current one. The peak table gives those GPUs an fp16 figure, and an fp16 product runs
(on the CPU too) and agrees with fp32."""

from __future__ import annotations

import contextlib

import pytest
import torch

from helpers import matmul, timing


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch):
    """Install fake GPUs with the given compute capabilities; cuda:0 stays current."""
    current = [0]

    def install(*caps: tuple[int, int]) -> list[int]:
        @contextlib.contextmanager
        def make_current(device):
            old, current[0] = current[0], torch.device(device).index
            try:
                yield
            finally:
                current[0] = old

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
        monkeypatch.setattr(torch.cuda, "get_device_capability",
                            lambda device=None: caps[torch.device(device).index])
        monkeypatch.setattr(torch.cuda, "device", make_current)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True: caps[current[0]] >= (8, 0))
        return current

    return install


def test_fp16_is_a_mode_of_the_sweep() -> None:
    assert matmul.MODES["fp16"] == (torch.float16, "ieee")
    assert matmul.TENSOR_CORES_SINCE == (7, 0)


@pytest.mark.parametrize(("caps", "expected"), [
    ((6, 1), ["fp32"]),                          # Pascal: no tensor cores
    ((7, 0), ["fp32", "fp16"]),                  # V100
    ((7, 5), ["fp32", "fp16"]),                  # T4: fp16 is its tensor-core format
    ((8, 0), ["fp32", "tf32", "bf16"]),          # A100: bf16 runs where fp16 does, same peak
    ((9, 0), ["fp32", "tf32", "bf16"]),          # H100
])
def test_each_gpu_generation_measures_its_tensor_core_formats(fake_gpus, caps, expected) -> None:
    fake_gpus(caps)
    assert matmul.supported_modes("cuda:0") == expected


def test_the_named_gpu_is_asked_not_the_current_one(fake_gpus) -> None:
    current = fake_gpus((7, 5), (9, 0))  # cuda:0 (current) a T4, cuda:1 an H100
    assert matmul.supported_modes("cuda:1") == ["fp32", "tf32", "bf16"]
    assert matmul.supported_modes("cuda:0") == ["fp32", "fp16"]
    assert current == [0], "the current GPU is restored"
    with pytest.raises(ValueError, match="cuda:2"):
        matmul.supported_modes("cuda:2")


def test_every_measured_tensor_core_format_has_a_peak_on_the_gpus_that_run_it() -> None:
    # A T4 and a V100 measure fp16; the table gives each a figure for it, several times fp32.
    for name in ("Tesla T4", "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-32GB"):
        assert timing.peak_tflops(name, "fp16") >= 2 * timing.peak_tflops(name, "fp32"), name
        assert timing.peak_tflops(name, "bf16") is None and timing.peak_tflops(name, "tf32") is None


def test_fp16_products_run_and_agree_with_fp32() -> None:
    # On the CPU fp16 is slow but correct; the product is checked against fp32 at fp16's
    # precision (10 mantissa bits over sums of 64 terms).
    timing_, tf = matmul.time_matmul(64, 64, 64, "cpu", "fp16", warmup=0, min_run_time=0.01,
                                     min_runs=2)
    assert tf > 0 and timing_.label == "fp16 64x64 @ 64x64"
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    torch.testing.assert_close((a.half() @ b.half()).float(), a @ b, rtol=0.02, atol=0.1)
