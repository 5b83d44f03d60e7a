"""The terminal side of `hivemind-chat` (bridges/cli.py): what a turn looks like on screen or
as JSON lines, the spinner while the hub thinks, and the line editing and type-ahead that make
the interactive prompt usable. Speech between turns is drawn above the prompt without losing
what the user has typed so far, which is why the prompt on screen is remembered here.
"""
import contextlib
import json
import os
import sys
import threading
from typing import Optional

from hivemind_chat_agent import background


class Output:
    """Human or JSON-lines rendering of a turn; the only place that prints."""

    def __init__(self, as_json: bool):
        self.as_json = as_json
        self.tty = sys.stdout.isatty() and not as_json

    def sentence(self, text: str, session: str, first: bool):
        if self.as_json:
            self._json(type="sentence", session=session, text=text)
        else:
            print(("hub> " if first else "     ") + text if self.tty else text, flush=True)

    def end(self, session: str, sentences: int, elapsed: float, status: str = ""):
        if self.as_json:
            self._json(type="end", session=session, sentences=sentences,
                       elapsed=round(elapsed, 3), status=status)
        elif sentences == 0:
            print("(the hub had no answer for that)", flush=True)

    def error(self, error: Exception):
        if self.as_json:
            self._json(type="error", error=type(error).__name__, message=str(error))
        else:
            print(f"error: {error}", file=sys.stderr, flush=True)

    def aside(self, text: str, session: str):
        """Speech between turns (an alarm firing while the prompt waits)."""
        if self.as_json:
            self._json(type="aside", session=session, text=text)
            return
        if not self.tty:
            print(text, flush=True)
            return
        with _PROMPT_LOCK:
            typed = _line_buffer()
            sys.stdout.write(f"\r\033[Khub> {text}\n{PROMPT_ON_SCREEN[0]}{typed}")
            sys.stdout.flush()

    def info(self, text: str):
        if not self.as_json:
            print(text, file=sys.stderr, flush=True)

    @staticmethod
    def _json(**obj):
        print(json.dumps(obj, ensure_ascii=False), flush=True)


class Spinner:
    """A waiting indicator on the terminal until the first sentence arrives."""
    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self):
        if self.enabled:
            self._thread = threading.Thread(target=self._spin, daemon=True)
            background.start(self._thread)
        return self

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            sys.stdout.write("\r\033[K")
            sys.stdout.flush()

    def __exit__(self, *_exc):
        self.stop()

    def _spin(self):
        i = 0
        while not self._stop.wait(0.1):
            sys.stdout.write(f"\r{self.FRAMES[i % len(self.FRAMES)]} thinking…")
            sys.stdout.flush()
            i += 1


# the prompt on screen (the interactive chat sets it), to redraw it after speech between turns
PROMPT_ON_SCREEN = [""]
_PROMPT_LOCK = threading.Lock()


def _line_buffer() -> str:
    try:
        import readline
        return readline.get_line_buffer()
    except Exception:
        return ""


@contextlib.contextmanager
def keep_typeahead(enabled: bool):
    """While an answer arrives, keep what the user types (a Ctrl-D to leave, the next question)
    as plain bytes for the next prompt. In the terminal's canonical mode a Ctrl-D typed now
    becomes an end-of-file event that is lost when readline switches modes at the prompt."""
    if not enabled:
        yield
        return
    try:
        import termios
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        raw = termios.tcgetattr(fd)
        raw[3] &= ~termios.ICANON                 # lflags; ISIG stays: Ctrl-C still works
        termios.tcsetattr(fd, termios.TCSANOW, raw)
    except (ImportError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def enable_line_editing():
    """readline gives line editing and history; returns the function that saves history."""
    try:
        import readline
    except ImportError:
        return lambda: None
    path = os.path.join(os.path.expanduser("~"), ".hivemind_chat_history")
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(1000)

    def save():
        try:
            readline.write_history_file(path)
        except OSError:
            pass
    return save

