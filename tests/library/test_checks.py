"""helpers.checks: hardware-dependent claims and the %%gpu_only cell magic."""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers import checks


def test_expect_passes_quietly(monkeypatch):
    monkeypatch.setenv("BOOK_STRICT", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert checks.expect(2 > 1, "two is more than one") is True


def test_expect_strict_raises_with_the_claim_and_figures(monkeypatch):
    monkeypatch.setenv("BOOK_STRICT", "1")
    with pytest.raises(checks.ClaimNotMet, match=r"the GPU is faster.*gpu_ms=1\.5, cpu_ms=1"):
        checks.expect(False, "the GPU is faster", gpu_ms=1.5, cpu_ms=1)


@pytest.mark.parametrize("value", ["", "0"])
def test_expect_warns_in_a_readers_session(monkeypatch, value):
    monkeypatch.setenv("BOOK_STRICT", value)
    with pytest.warns(checks.ClaimWarning, match=r"the GPU is faster.*ratio=0\.8"):
        assert checks.expect(False, "the GPU is faster", ratio=0.8) is False


@pytest.mark.parametrize(
    ("condition", "claim", "error", "match"),
    [
        (True, "", TypeError, "claim in words"),
        (True, None, TypeError, "claim in words"),
        (torch.tensor([True, False]), "both hold", TypeError, "single truth value"),
    ],
)
def test_expect_bad_input(condition, claim, error, match):
    with pytest.raises(error, match=match):
        checks.expect(condition, claim)


def test_strict_rejects_other_values(monkeypatch):
    monkeypatch.setenv("BOOK_STRICT", "yes")
    with pytest.raises(ValueError, match="BOOK_STRICT='yes'.*use 1"):
        checks.strict()


def test_gpu_only_reason_on_the_cpu():
    reason = checks.gpu_only_reason(torch.device("cpu"))
    assert reason.startswith("This cell needs a CUDA GPU; this run uses cpu:")
    assert "Colab" in reason and len(reason) < 160
    assert "an Apple GPU" in checks.gpu_only_reason("cpu", "--kinds cuda,mps")
    two = checks.gpu_only_reason("cpu", "--gpus 2")
    assert "2 GPUs" in two and "several GPUs" in two and "T4" not in two


def test_gpu_only_reason_on_a_matching_device(monkeypatch):
    monkeypatch.setattr(checks, "_count", lambda kind: 1)
    assert checks.gpu_only_reason(torch.device("cuda", 0)) is None
    assert checks.gpu_only_reason(torch.device("mps", 0), "--kinds cuda,mps") is None
    assert "this machine has 1" in checks.gpu_only_reason(torch.device("cuda", 0), "--gpus 2")


@pytest.mark.parametrize("line", ["--kinds cpu", "--kinds ''", "--gpus 0", "--gpus two",
                                  "--colour red", "'unclosed"])
def test_gpu_only_bad_options(line):
    with pytest.raises(ValueError, match="%%gpu_only"):
        checks.gpu_only_reason("cpu", line)


class _Shell:
    def __init__(self):
        self.user_ns: dict = {}
        self.shown: list = []

    def displayhook(self, value):
        self.shown.append(value)


def test_run_body_defines_variables_and_shows_the_last_value():
    shell = _Shell()
    checks._run_body(shell, "x = 3\nx + 1\n")
    assert shell.user_ns["x"] == 3 and shell.shown == [4]
    checks._run_body(shell, "y = x * 2\n")
    assert shell.user_ns["y"] == 6 and shell.shown == [4]


def test_run_body_propagates_errors():
    with pytest.raises(ZeroDivisionError):
        checks._run_body(_Shell(), "1 / 0\n")


def test_register_magics_outside_ipython():
    assert checks.register_magics(torch.device("cpu")) is False
