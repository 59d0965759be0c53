"""halluc_lab.shared_gpu: a private MPS daemon for a block, driven through a stand-in for NVIDIA's
control program (a shell script that records how it was called), since CI has no GPU."""

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from halluc_lab import shared_gpu

STAND_IN = """#!/bin/sh
# records each call: its arguments, the pipe folder it was given, and what came on stdin
if [ "$1" = "-d" ]; then echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "{log}"; exit {start_rc}; fi
read line; echo "$line $CUDA_MPS_PIPE_DIRECTORY" >> "{log}"
"""


def stand_in(tmp_path: Path, monkeypatch, start_rc: int = 0) -> Path:
    """Put a fake ``nvidia-cuda-mps-control`` first on PATH; the path of its record of calls."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    program = bin_dir / shared_gpu.CONTROL
    program.write_text(STAND_IN.format(log=log, start_rc=start_rc))
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_the_block_is_a_client_of_its_own_daemon_and_leaves_the_environment_as_before(tmp_path,
                                                                                       monkeypatch):
    log = stand_in(tmp_path, monkeypatch)
    monkeypatch.setenv(shared_gpu.ENV_LOG, "/somewhere/else")  # restored afterwards, not dropped
    monkeypatch.delenv(shared_gpu.ENV_PIPE, raising=False)
    with shared_gpu.mps_service(tmp_path / "mps") as env:
        assert env == {shared_gpu.ENV_PIPE: str(tmp_path / "mps" / "pipe"),
                       shared_gpu.ENV_LOG: str(tmp_path / "mps" / "log")}
        show = f"import os; print(os.environ['{shared_gpu.ENV_PIPE}'])"
        child = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True,
                               check=True)
        # a process started inside the block is a client
        assert child.stdout.strip() == env[shared_gpu.ENV_PIPE]
        assert (tmp_path / "mps" / "pipe").is_dir() and (tmp_path / "mps" / "log").is_dir()
    assert os.environ[shared_gpu.ENV_LOG] == "/somewhere/else"
    assert shared_gpu.ENV_PIPE not in os.environ
    pipe = tmp_path / "mps" / "pipe"
    # started, then stopped
    assert log.read_text().splitlines() == [f"start {pipe}", f"quit {pipe}"]


def test_the_daemon_is_stopped_when_the_block_raises(tmp_path, monkeypatch):
    log = stand_in(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="a chapter failed"):
        with shared_gpu.mps_service(tmp_path / "mps"):
            raise ValueError("a chapter failed")
    assert log.read_text().splitlines()[-1].startswith("quit ")


def test_no_control_program_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(shared_gpu.MPSUnavailable, match="needs a CUDA GPU"):
        with shared_gpu.mps_service(tmp_path / "mps"):
            pass


def test_a_daemon_that_will_not_start_is_a_clear_error_and_changes_nothing(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch, start_rc=3)
    monkeypatch.delenv(shared_gpu.ENV_PIPE, raising=False)
    with pytest.raises(shared_gpu.MPSUnavailable, match="exited with 3"):
        with shared_gpu.mps_service(tmp_path / "mps"):
            pass
    assert shared_gpu.ENV_PIPE not in os.environ


@pytest.mark.gpu
def test_a_real_daemon_serves_a_cuda_process_and_is_stopped_after():
    if shutil.which(shared_gpu.CONTROL) is None:
        pytest.skip(f"needs NVIDIA's {shared_gpu.CONTROL}")
    folder = Path(tempfile.mkdtemp(prefix="mps-"))  # short: the daemon's socket lives in it
    with shared_gpu.mps_service(folder):
        use = "import torch; print(torch.ones(4, device='cuda').sum().item())"
        child = subprocess.run([sys.executable, "-c", use], capture_output=True, text=True,
                               timeout=300)
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "4.0"
    log = (folder / "log" / "control.log").read_text()
    # a server started for the client, and stopped when the block ended
    assert re.search(r"Server \d+ exited with status 0", log), log
