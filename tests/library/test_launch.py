"""helpers.launch (chapters 7 and 10) with real processes: a hanging torchrun run is stopped
with its likely causes named and its echoed output kept out of the error, torchrun's log
folder is removed, and the torchrun command line. A crashed rank reported with its output in
the error is test_launch_bad_input.py's test_launch_a_rank_that_fails."""

from __future__ import annotations

import os
import subprocess
import warnings
from pathlib import Path

import pytest

from helpers import launch
from tests.support import alive

# Each rank writes its pid and prints before anything slow happens; rank 1 never imports
# torch at all, so the test depends only on torchrun starting its workers, not on how fast
# a loaded machine imports torch.
_HANG = """
import os, sys, time
from pathlib import Path

Path(sys.argv[1], f"pid{os.environ['RANK']}").write_text(str(os.getpid()))
print(f"rank {os.environ['RANK']} started", flush=True)
if os.environ["RANK"] == "1":
    time.sleep(3600)  # a rank that never joins
import torch.distributed as dist
dist.init_process_group("gloo")  # rank 0 waits here for rank 1
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_launch_stops_a_hanging_run_and_names_the_causes(tmp_path: Path, capsys):
    script = tmp_path / "hang.py"
    script.write_text(_HANG)
    # The limit must also cover torchrun's own start (it imports torch before it starts the
    # workers): both had started after 5.3 s on a 2-core machine with a load of 3.6, so the
    # first limit, 15 s, leaves nearly three times that and the test no longer sits through
    # 20. Where both workers had not started by then (a more loaded machine), the case is run
    # again with a longer limit, and says so; every assertion below holds for the run that
    # counts. The run hangs whatever the limit, so each attempt lasts its whole limit.
    every_pid = []  # of every attempt: none may outlive its run
    for limit in (15, 45):
        for f in tmp_path.glob("pid*"):
            every_pid.append(int(f.read_text()))
            f.unlink()
        with pytest.raises(launch.LaunchError) as caught:
            launch.launch(2, [script, tmp_path], timeout=limit, grace=5)
        if len(list(tmp_path.glob("pid*"))) == 2:
            break
        warnings.warn(f"both workers had not started within {limit} s: trying a longer limit",
                      stacklevel=1)
    message = str(caught.value)
    assert f"time limit of {limit} s" in message
    for cause in ("rank crashed", "world size does not match", "NCCL_DEBUG=INFO",
                  "MASTER_PORT"):
        assert cause in message, cause
    # The output was streamed as it came (echo, the default), so it is kept out of the
    # error, which says what happened and why; and every worker is gone. (A crash with echo
    # took a torchrun run of its own before; launch() builds both errors with the same
    # lines, and a crash without echo is test_launch_bad_input's test_launch_a_rank_that_fails.)
    assert "rank 1 started" in capsys.readouterr().out
    assert "rank 1 started" not in message and "rank 0 started" not in message
    pid_files = [tmp_path / f"pid{r}" for r in range(2)]
    assert all(f.exists() for f in pid_files), "torchrun started both workers"
    pids = every_pid + [int(f.read_text()) for f in pid_files]
    assert not [pid for pid in pids if alive(pid)], "a worker outlived the time limit"


def test_launch_gives_torchrun_a_log_folder_it_removes(tmp_path: Path, monkeypatch):
    # Without --log-dir torchrun makes a torchelastic_* folder in /tmp for every run and
    # leaves it there. The worker prints where torchrun keeps its files.
    script = tmp_path / "where.py"
    script.write_text("import os\nprint('error file:', os.environ['TORCHELASTIC_ERROR_FILE'])\n")
    commands: list[list[str]] = []
    real_popen = subprocess.Popen

    def spy(command, *args, **kwargs):
        commands.append(list(command))
        return real_popen(command, *args, **kwargs)

    monkeypatch.setattr(launch.subprocess, "Popen", spy)
    output = launch.launch(1, [script], timeout=300, echo=False)
    (command,) = commands
    assert command.index("--log-dir") < command.index(str(script)), "a torchrun option"
    log_dir = command[command.index("--log-dir") + 1]
    error_file = output.split("error file:", 1)[1].split()[0]
    assert error_file.startswith(log_dir + os.sep), "torchrun used the folder it was given"
    assert not Path(log_dir).exists(), "and the folder is gone once the run has ended"


def test_torchrun_command():
    assert launch.torchrun_command(2, ["-m", "x"])[1:] == [
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "x"]
    assert launch.torchrun_command(1, ["a.py"], log_dir="/l")[-3:] == ["--log-dir", "/l",
                                                                          "a.py"]


def test_run_ddp_without_echo_prints_nothing(tmp_path: Path, monkeypatch, capsys):
    calls = []

    def fake_launch(nproc, program, *, timeout, echo):
        calls.append(echo)
        (tmp_path / "summary.json").write_text('{"world_size": 2}')
        return ""

    monkeypatch.setattr(launch, "launch", fake_launch)
    assert launch.run_ddp(2, "gloo", tmp_path, "--epochs", 1, echo=False) == {"world_size": 2}
    assert calls == [False] and capsys.readouterr().out == ""
    launch.run_ddp(2, "gloo", tmp_path, "--epochs", 1)
    assert calls == [False, True] and "$ torchrun" in capsys.readouterr().out


def test_launch_checks_its_arguments():
    with pytest.raises(ValueError, match="nproc"):
        launch.launch(0, ["x.py"])
    with pytest.raises(ValueError, match="timeout"):
        launch.launch(1, ["x.py"], timeout=0)
