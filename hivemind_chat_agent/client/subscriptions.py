"""Speech between turns: what a skill says for a session when no turn of it is running.

Alarms firing, reminders, timers, a question's "I didn't hear a time…" after its window closed:
a voice satellite plays these whenever they come. A `Subscription` is how a caller gets them:
iterate it (each sentence as a `str`, blocking until the next one or `close()`), or give a
callback, which runs on the subscription's own thread so a slow callback never holds up the
connection that received the sentence.
"""
import threading
from collections import deque
from typing import Callable, Deque, Dict, List, Optional

from ovos_utils.log import LOG

from hivemind_chat_agent import background

MAX_PENDING = 1000   # sentences kept for an iterator that is not being read; oldest dropped


class Subscription:
    def __init__(self, session_id: str, callback: Optional[Callable[[str], None]] = None,
                 on_close: Callable[["Subscription"], None] = lambda sub: None):
        self.session_id = session_id
        self._callback = callback
        self._on_close = on_close
        self._pending: Deque[str] = deque(maxlen=MAX_PENDING)
        self._for_callback: Deque[str] = deque(maxlen=MAX_PENDING)
        self._cond = threading.Condition()
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        if callback is not None:
            self._thread = threading.Thread(target=self._run_callbacks, daemon=True,
                                            name=f"hivemind-chat-sub-{session_id}")
            background.start(self._thread)

    @property
    def closed(self) -> bool:
        return self._closed

    def deliver(self, sentence: str) -> None:
        with self._cond:
            if self._closed:
                return
            self._pending.append(sentence)
            if self._callback is not None:
                self._for_callback.append(sentence)
            self._cond.notify_all()

    def get(self, timeout: Optional[float] = None) -> Optional[str]:
        """The next sentence, or None after `timeout` seconds or once closed."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._pending or self._closed, timeout):
                return None
            return self._pending.popleft() if self._pending else None

    def __iter__(self):
        return self

    def __next__(self) -> str:
        sentence = self.get()
        if sentence is None:
            raise StopIteration
        return sentence

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._on_close(self)   # the callback thread sees `closed` and ends by itself

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *_exc):
        self.close()

    def _run_callbacks(self):
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._for_callback or self._closed)
                if not self._for_callback:
                    return
                sentence = self._for_callback.popleft()
            try:
                self._callback(sentence)
            except Exception as e:   # the caller's bug must not end the subscription
                LOG.warning(f"subscription callback for session {self.session_id} raised "
                            f"{type(e).__name__}: {e}")


class Subscribers:
    """Subscriptions by session_id; `deliver` is called from connection threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._subs: Dict[str, List[Subscription]] = {}

    def add(self, sub: Subscription) -> bool:
        """True when this is the session's first subscription."""
        with self._lock:
            subs = self._subs.setdefault(sub.session_id, [])
            subs.append(sub)
            return len(subs) == 1

    def remove(self, sub: Subscription) -> bool:
        """True when the session has no subscription left."""
        with self._lock:
            subs = self._subs.get(sub.session_id, [])
            if sub in subs:
                subs.remove(sub)
            if not subs:
                self._subs.pop(sub.session_id, None)
                return True
            return False

    def sessions(self) -> set:
        with self._lock:
            return set(self._subs)

    def deliver(self, session_id: str, sentence: str) -> int:
        with self._lock:
            subs = list(self._subs.get(session_id, ()))
        for sub in subs:
            sub.deliver(sentence)
        if not subs:
            LOG.debug(f"session {session_id}: a sentence spoken between turns, no subscriber")
        return len(subs)

    def close_all(self) -> None:
        with self._lock:
            subs = [s for group in self._subs.values() for s in group]
        for sub in subs:
            sub.close()
