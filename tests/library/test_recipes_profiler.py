"""Every ``torch.profiler.profile`` the book opens passes ``acc_events=True`` (chapters 11, 12;
helpers; the benchmark).

torch 2.10 and 2.11 warn "Profiler clears events at the end of each cycle. ... set
acc_events=True." on every profile opened with ``acc_events=False``, the default
(``_KinetoProfile.prepare_trace``; the first GPU run showed it on chapters 11 and 12). The book
profiles one cycle, so accumulating changes nothing it reports, and the pages stay clean on
every supported torch. The pinned torch does not warn where the book opens its profiles, so
this test reads the sources instead of waiting for the warning.
"""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("helpers/*.py"),
                  *ROOT.glob("bench/*.py")])


def _code(path: Path) -> str:
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    # Cell magics (%%gpu_only) and shell lines are not Python: blank them, keep line numbers.
    return "\n".join("\n".join("" if line.lstrip().startswith(("%", "!")) else line
                               for line in "".join(c["source"]).splitlines())
                     for c in cells if c["cell_type"] == "code")


def _recording(node: ast.AST) -> bool:
    """True for ``with warnings.catch_warnings(record=True)``: its warnings are recorded."""
    return isinstance(node, ast.With) and any(
        isinstance(call := item.context_expr, ast.Call)
        and ast.unparse(call.func).endswith("catch_warnings")
        and any(k.arg == "record" and isinstance(k.value, ast.Constant)
                and k.value.value is True for k in call.keywords)
        for item in node.items)


def profiles_without_acc_events(source: str) -> list[int]:
    """Lines of the calls to ``profile(...)`` / ``torch.profiler.profile(...)`` in ``source``
    that do not pass ``acc_events=True``, except inside ``with
    warnings.catch_warnings(record=True)``, where the warning is recorded, not shown
    (chapter 11's check of which torch warns)."""
    tree = ast.parse(source)
    recorded = {id(inner) for node in ast.walk(tree) if _recording(node)
                for stmt in node.body for inner in ast.walk(stmt)}
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in recorded:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else (
            func.attr if isinstance(func, ast.Attribute) else "")
        owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        if name != "profile" or (owner and not owner.endswith("profiler")):
            continue
        accumulate = [k for k in node.keywords if k.arg == "acc_events"]
        if not (accumulate and isinstance(accumulate[0].value, ast.Constant)
                and accumulate[0].value.value is True):
            lines.append(node.lineno)
    return lines


def test_the_reader_finds_calls_with_and_without_the_argument() -> None:
    source = ("from torch.profiler import profile\nimport torch\n"
              "with profile(activities=a) as p: pass\n"
              "with torch.profiler.profile(acc_events=True) as q: pass\n"
              "with torch.profiler.profile(acc_events=False) as r: pass\n"
              "profile_once(fn)\n"
              "with warnings.catch_warnings(record=True) as w:\n"
              "    with profile(activities=a) as s: pass\n"
              "with warnings.catch_warnings():\n"
              "    with profile(activities=a) as t: pass\n")
    assert profiles_without_acc_events(source) == [3, 5, 10]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_profile_accumulates_its_events(path: Path) -> None:
    missing = profiles_without_acc_events(_code(path))
    assert not missing, (f"{path.relative_to(ROOT)}: torch.profiler.profile without "
                         f"acc_events=True (code lines {missing}); torch 2.10 and 2.11 warn")


def test_the_argument_exists_and_one_cycle_reports_everything() -> None:
    """acc_events=True on one cycle: the same events, and no warning on any torch."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with profile(activities=[ProfilerActivity.CPU], acc_events=True) as prof:
            for _ in range(3):
                with record_function("region"):
                    torch.ones(4).sum()
    counts = {e.key: e.count for e in prof.key_averages()}
    assert counts["region"] == 3


def _scheduled_counts(*, repeat: int, acc_events: bool) -> int:
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    warm = schedule(wait=1, warmup=1, active=3, repeat=repeat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2.10 and 2.11 warn without acc_events
        with profile(activities=[ProfilerActivity.CPU], schedule=warm,
                     acc_events=acc_events) as prof:
            for _ in range(5 * repeat):
                with record_function("step"):
                    torch.ones(4).sum()
                prof.step()
    return next(e.count for e in prof.key_averages() if e.key == "step")


def test_a_schedule_reports_its_active_steps_only() -> None:
    """Chapter 11 profiles five steps with schedule(wait=1, warmup=1, active=3): the table
    holds the three active steps, with acc_events=True as without. Over two cycles
    acc_events=True keeps both cycles' steps (six), without it only the last cycle's."""
    assert _scheduled_counts(repeat=1, acc_events=True) == 3
    assert _scheduled_counts(repeat=1, acc_events=False) == 3
    assert _scheduled_counts(repeat=2, acc_events=True) == 6
    assert _scheduled_counts(repeat=2, acc_events=False) == 3
