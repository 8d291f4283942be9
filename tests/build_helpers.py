"""Shared by the builder tests: multi-process launches, killing a build mid-way, shard digests."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ACCELERATE = Path(sys.executable).parent / "accelerate"


def accelerate_cmd(script: Path, *args: str, processes: int = 2) -> list[str]:
    """`accelerate launch` with N CPU processes: `--cpu` would start only one (accelerate 1.15.0's
    `launch_command` sends `--cpu` to its single-process `simple_launcher`), so this uses the
    multi-GPU launcher, and the builders ask accelerate for the CPU themselves."""
    return [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            str(script), *args]


def shard_digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "data").rglob("*.parquet"))}


def kill_after_parts(cmd: list[str], stats_dir: Path, min_parts: int, timeout: float,
                     poll: float) -> int:
    """Start `cmd`, SIGKILL its whole process group once `min_parts` parts have finished, and
    return how many had finished by then."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    while time.time() < deadline and len(list(stats_dir.glob("*.json"))) < min_parts:
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        time.sleep(poll)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return len(list(stats_dir.glob("*.json")))
