"""How many lines of one kind the hub writes to its log, without I/O.

A refusal is logged so the operator learns why a satellite was not answered. But a satellite
that floods (or an attacker who knows an access key but not its password) can make the hub
refuse hundreds of messages a second, and a line for each buries everything else and fills
the disk. So each kind of line for each sender gets `lines` per `window` seconds; the rest are
counted, not written, and the first line of the next window says how many were left out.

Keys are the caller's (a kind and a peer name); at most `max_keys` are tracked, the oldest
forgotten first, so a flood of made-up peer names costs bounded memory (a forgotten key starts
with a fresh allowance: more lines, never fewer than the budget says).
"""
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable, Optional

LINES_PER_WINDOW = 5
WINDOW_SECONDS = 60.0
MAX_KEYS = 1024


@dataclass
class _Allowance:
    window_start: float
    written: int = 0
    left_out: int = 0


class LogBudget:
    """`admit(key)` says whether to write this line: None to leave it out, else the text to
    append to it ("" normally; a note of how many were left out when a new window opens after
    some were)."""

    def __init__(self, lines: int = LINES_PER_WINDOW, window: float = WINDOW_SECONDS,
                 max_keys: int = MAX_KEYS, now: Callable[[], float] = time.monotonic):
        self.lines, self.window, self.max_keys, self.now = lines, window, max_keys, now
        self._keys: "OrderedDict[Hashable, _Allowance]" = OrderedDict()
        self._lock = threading.Lock()     # the IO loop, workers and the bus thread all log

    def admit(self, key: Hashable) -> Optional[str]:
        with self._lock:
            return self._admit(key, self.now())

    def _admit(self, key: Hashable, now: float) -> Optional[str]:
        allowance = self._keys.get(key)
        if allowance is None:
            allowance = self._keys[key] = _Allowance(now)
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        note = ""
        if now - allowance.window_start >= self.window:
            if allowance.left_out:
                note = (f" ({allowance.left_out} more like it in the "
                        f"{now - allowance.window_start:.0f} s before were not logged)")
            allowance.window_start, allowance.written, allowance.left_out = now, 0, 0
        if allowance.written >= self.lines:
            allowance.left_out += 1
            return None
        allowance.written += 1
        if allowance.written == self.lines:
            note += f" (more lines like this are held back for up to {self.window:.0f} s)"
        return note

    def __len__(self) -> int:
        return len(self._keys)
