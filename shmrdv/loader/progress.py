"""A loader's progress bar: batches/s and GB/s, through tqdm when it is
installed (an optional dependency), else a line on stderr twice a second."""
import sys
import time
from typing import Any, Optional


class Progress:
    def __init__(self, total: Optional[int]) -> None:
        self.total, self.batches, self.nbytes = total, 0, 0
        self.start = self.shown = time.monotonic()
        self.bar: Any = None
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, unit="batch", dynamic_ncols=True)

    def _gbps(self) -> float:
        return self.nbytes / max(time.monotonic() - self.start, 1e-9) / 1e9

    def update(self, nbytes: int) -> None:
        self.batches += 1
        self.nbytes += nbytes
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(1)
            if now - self.shown >= 0.5:
                self.bar.set_postfix_str(f"{self._gbps():.2f} GB/s", refresh=False)
                self.shown = now
        elif now - self.shown >= 0.5:
            self.shown = now
            self._line()

    def _line(self, end: str = "") -> None:
        rate = self.batches / max(time.monotonic() - self.start, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        sys.stderr.write(f"\r{self.batches}{of} batches, {rate:.1f} batches/s, {self._gbps():.2f} GB/s{end}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self._gbps():.2f} GB/s", refresh=False)
            self.bar.close()
            self.bar = None
        elif self.batches:
            self._line("\n")
            self.batches = 0
