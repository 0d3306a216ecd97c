"""Progress of anything a person waits on (episodes, task checks, training steps, agent runs):
a tqdm bar on a terminal, otherwise a timestamped line to stderr every few seconds.

Under a log file, ``nohup`` or CI there is no terminal to redraw a bar on, so ``Progress``
writes ``[HH:MM:SS] DESC: DONE/TOTAL UNIT (RATE, ELAPSED)`` lines instead: one when it
starts, one every ``HARNESSRL_PROGRESS_S`` seconds (default 10; a heartbeat from a timer, so
a slow step is not silent) and one at the end. ``Progress.note`` prints a line (a finished
task's PASS/FAIL, say) without breaking the bar.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any, TypeVar

T = TypeVar("T")

DEFAULT_INTERVAL_S = 10.0


def interval_s() -> float:
    """Returns the seconds between progress lines off a terminal (``HARNESSRL_PROGRESS_S``)."""
    try:
        return max(0.0, float(os.environ.get("HARNESSRL_PROGRESS_S", DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


class Progress:
    """``total`` units of work called ``unit``; ``update`` as each finishes, ``close`` at the
    end (or use it as a context manager). ``enabled=False`` shows nothing."""

    def __init__(self, total: int, desc: str, unit: str = "it", enabled: bool = True,
                 stream: IO[str] | None = None, every_s: float | None = None) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.done = 0
        self.postfix = ""
        self.start = time.monotonic()
        self.bar: Any = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._timer: threading.Thread | None = None
        if not enabled:
            return
        if _is_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, file=self.stream)
            return
        self.every_s = interval_s() if every_s is None else every_s
        self._line()
        if self.every_s > 0:
            self._timer = threading.Thread(target=self._beat, name=f"progress-{desc}", daemon=True)
            self._timer.start()

    @classmethod
    def over(cls, items: Sequence[T], desc: str, unit: str = "it") -> Iterator[T]:
        """Yields ``items`` one by one, counting each as done when the next is asked for."""
        with cls(len(items), desc, unit) as progress:
            for item in items:
                yield item
                progress.update(1)

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Counts ``n`` more finished units; ``postfix`` (``tok_s=12.3``) is shown beside them.
        With a zero interval every update writes a line."""
        if not self.enabled:
            return
        with self._lock:
            self.done += n
            if postfix:
                self.postfix = ", ".join(f"{k} {v}" for k, v in postfix.items())
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix)
        elif self.every_s == 0:
            self._line()

    def note(self, text: str) -> None:
        """Prints ``text`` as its own line (above the bar on a terminal)."""
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
            self._timer = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.every_s != 0 or self.done == 0:
            self._line()
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            self._line()

    def _line(self) -> None:
        with self._lock:
            elapsed = time.monotonic() - self.start
            rate = f"{self.done / elapsed:.2f} {self.unit}/s, " if self.done and elapsed > 0 else ""
            extra = f", {self.postfix}" if self.postfix else ""
            text = (f"[{time.strftime('%H:%M:%S')}] {self.desc}: {self.done}/{self.total} {self.unit} "
                    f"({rate}{elapsed:.0f}s{extra})")
        print(text, file=self.stream, flush=True)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
