"""Peak memory of a block of work, for `counterfactory doctor`'s rows (builders/devtools/doctor.py)
and the stages that measure a part of their work on their own (doctor_stages, doctor_generators):
CUDA's own peak counter on a GPU, the process's RSS sampled by a thread on the CPU."""

from __future__ import annotations

import threading
import time


class PeakMemory:
    """Peak memory while inside the block, and the memory when it began (bytes)."""

    def __init__(self, device: str, interval: float = 0.002) -> None:
        self.device, self.interval = device, interval
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        import psutil

        process = psutil.Process()
        self.base = self.peak = process.memory_info().rss

        def sample() -> None:
            while not self._stop.is_set():
                self.peak = max(self.peak, process.memory_info().rss)
                time.sleep(self.interval)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
            return
        self._stop.set()
        self._thread.join()
