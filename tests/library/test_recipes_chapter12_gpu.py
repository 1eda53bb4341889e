"""Chapter 12's GPU-only cells of the residual-CNN section and its committed-figures cell,
run on the CPU with what a CUDA GPU would give them faked.

The GPU cell profiles the residual CNN's plain step (``device_busy``) and compares the GPU's
busy share with the small CNN's; its hidden check holds the page's claims: the residual CNN
keeps the GPU busy, on a GPU of 100 SMs or more the small CNN's step does not, and mixed
precision speeds up the busy step. Here the profile, the device's SM count and the timings
are faked as an H200 and a T4 would give them, in a strict run (``BOOK_STRICT=1``), so the
CPU proves the cells pass where the claims hold and fail where they do not. The committed
small-CNN figures are compared by the page's rule: the H200's plain step (spread 16% of its
median) gives no recipe a verdict.
"""

from __future__ import annotations

import json
import types

import pandas as pd
import pytest
import torch

import helpers
from helpers.checks import ClaimNotMet
from helpers.recipes import DeviceBusy
from helpers.timing import NO_DIFFERENCE, Timing, compare
from tests.conftest import ROOT

NOTEBOOK = ROOT / "chapters" / "12_performance.ipynb"


def _cell(marker: str) -> str:
    sources = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"]]
    (source,) = [s for s in sources if marker in s]
    return source.removeprefix("%%gpu_only\n")


def _timing(ms: float, label: str) -> Timing:
    s = ms / 1e3
    times = tuple(s * f for f in (0.99, 0.995, 1.0, 1.005, 1.01) * 4)
    return Timing(label=label, device="cuda:0", median=s, iqr=s * 0.01, mean=s, times=times)


class _Props:
    def __init__(self, sms: int) -> None:
        self.multi_processor_count = sms


def _namespace(*, sms: int, small_share: float, res_busy_ms: float, mixed_ms: float,
               monkeypatch: pytest.MonkeyPatch) -> dict:
    """The names the GPU cells read, as a CUDA run of the page leaves them."""
    monkeypatch.setenv("BOOK_STRICT", "1")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: _Props(sms))
    mixed = "bf16_autocast" if sms >= 100 else "fp16_autocast_gradscaler"
    res = {"plain": _timing(10.0, "plain"), mixed: _timing(mixed_ms, mixed),
           "channels_last": _timing(9.0, "channels_last"),
           "cudnn_benchmark": _timing(9.5, "cudnn_benchmark")}
    res_recipes = list(res)
    calls = []

    def make_step(recipe, device, batch, *, model, width):
        calls.append((recipe, batch, model, width))
        return lambda: None

    def device_busy(fn, device):
        return DeviceBusy(steps=10, busy_ms=res_busy_ms, operations=40.0)

    bound = pd.DataFrame({"GPU busy share": [small_share]}, index=["plain"])
    return {"torch": torch, "pd": pd, "expect": helpers.checks.expect, "compare": compare,
            "device": types.SimpleNamespace(type="cuda"), "bound": bound, "res": res,
            "res_recipes": res_recipes, "mixed": mixed, "width": 64, "res_batch": 1024,
            "res_vs": {r: compare(res["plain"], res[r]) for r in res_recipes[1:]},
            "make_step": make_step, "device_busy": device_busy, "calls": calls}


def _run(ns: dict) -> None:
    exec(_cell("res_busy = device_busy("), ns)
    exec(_cell("# Check: the residual CNN keeps the GPU busy"), ns)


def test_h200_like_figures_pass_and_print_what_bounds_each_step(monkeypatch, capsys):
    ns = _namespace(sms=132, small_share=0.2, res_busy_ms=9.0, mixed_ms=6.0,
                    monkeypatch=monkeypatch)
    _run(ns)
    out = capsys.readouterr().out
    assert "the small CNN's step is bound by the host" in out
    assert "the residual CNN's step is bound by the GPU" in out
    assert ns["calls"] == [("plain", 1024, "resnet", 64)]
    assert ns["shares"]["residual CNN"] == pytest.approx(0.9)


def test_t4_like_small_cnn_bound_by_the_gpu_passes(monkeypatch, capsys):
    # A T4 (40 SMs) may keep busy even for the small CNN: the page claims nothing of it there.
    ns = _namespace(sms=40, small_share=0.8, res_busy_ms=9.5, mixed_ms=4.0,
                    monkeypatch=monkeypatch)
    _run(ns)
    assert "the small CNN's step is bound by the GPU" in capsys.readouterr().out


@pytest.mark.parametrize("case", [
    dict(sms=132, small_share=0.7, res_busy_ms=9.0, mixed_ms=6.0),  # small CNN GPU-bound
    dict(sms=132, small_share=0.2, res_busy_ms=3.0, mixed_ms=6.0),  # residual CNN host-bound
    dict(sms=132, small_share=0.2, res_busy_ms=9.0, mixed_ms=10.0),  # mixed precision no faster
    dict(sms=40, small_share=0.8, res_busy_ms=9.0, mixed_ms=12.0),  # fp16 slower on a T4
])
def test_a_false_claim_fails_the_strict_run(monkeypatch, case):
    with pytest.raises(ClaimNotMet):
        _run(_namespace(monkeypatch=monkeypatch, **case))


def test_committed_small_cnn_figures_compared_by_the_pages_rule(capsys):
    ns = {"helpers": helpers, "compare": compare}
    exec(_cell('small = helpers.results.committed("recipes", gpu_only=True)'), ns)
    out = capsys.readouterr().out
    figs = helpers.results.committed("recipes", gpu_only=True)
    h200 = figs[(figs["machine"] == "gpu-nvidia-h200-x1")].set_index("name")
    plain = h200.loc["plain_step_ms"]
    if plain["spread"] > 0.1 * plain["value"]:  # the committed H200 file: 16%
        after = out.split("gpu-nvidia-h200-x1: plain step")[1].splitlines()[1:]
        lines = [ln for ln in after if ln.startswith("  ") and "_step_ms" not in ln]
        assert len(lines) == 5 and all(NO_DIFFERENCE in ln for ln in lines), out
    assert "gpu-nvidia-h200-x1: plain step" in out


def test_residual_cnn_committed_figures_said_missing_or_shown(monkeypatch, capsys):
    source = _cell('res_figs = helpers.results.committed("recipes", gpu_only=True)')
    exec(source, {"helpers": helpers})
    figs = helpers.results.committed("recipes", gpu_only=True)
    if not figs["name"].str.startswith("resnet_").any():  # none committed yet
        assert "No GPU figures of the residual CNN committed yet" in capsys.readouterr().out
    faked = pd.DataFrame({"machine": ["gpu-x", "gpu-x", "gpu-x"],
                          "name": ["plain_step_ms", "resnet_plain_step_ms",
                                   "resnet_bf16_autocast_speedup"],
                          "value": [2.0, 7.5, 1.8]})
    monkeypatch.setattr(helpers.results, "committed", lambda *a, **k: faked)
    exec(source, {"helpers": helpers})
    out = capsys.readouterr().out
    assert "resnet_plain_step_ms" in out and "resnet_bf16_autocast_speedup" in out
    assert "gpu-x" in out and "plain_step_ms" not in out.replace("resnet_plain_step_ms", "")
