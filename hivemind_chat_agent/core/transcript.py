"""What each satellite session said and heard, for chat engines that keep no memory of their own.

OPM's `ChatEngine.continue_chat(messages, ...)` takes the conversation so far; persona and LLM
engines build their prompt from it. The hub keeps, per engine session, the last exchanges (the
user's utterance and the answer as the satellite received it) and hands them to the engine
before the new utterance. An exchange that was not answered (the engine failed, went silent,
the hub was busy) is kept with how it ended and never passed off as an answer: the engine does
not see it. A stopped answer (barge-in) is what the satellite heard before the stop.

Bounded per session in exchanges (`history_turns`) and in bytes of text (`history_bytes`: the
oldest exchanges go first; one exchange alone longer than that keeps its newest bytes). No I/O
and no locks: the hub holds its own lock around it.
"""
from dataclasses import dataclass
from typing import Dict, Iterable, List, Sequence, Tuple

ANSWERED = "answered"
STOPPED = "stopped"


@dataclass(frozen=True)
class Exchange:
    user: str
    assistant: str     # the sentences the satellite received, joined with "\n"
    ended: str         # ANSWERED, STOPPED, or the EndReason value of a failure

    @property
    def heard(self) -> bool:
        """Did the satellite get an answer (whole or stopped) the engine may build on?"""
        return self.ended in (ANSWERED, STOPPED) and bool(self.assistant)

    @property
    def size(self) -> int:
        return len(self.user.encode()) + len(self.assistant.encode())


class Transcripts:
    def __init__(self, history_turns: int = 10, history_bytes: int = 32768):
        if history_turns < 0 or history_bytes < 256:
            raise ValueError("history_turns must be >= 0 and history_bytes >= 256")
        self.history_turns = history_turns
        self.history_bytes = history_bytes
        self._sessions: Dict[str, List[Exchange]] = {}

    def messages(self, session_id: str, utterance: str) -> List[Tuple[str, str]]:
        return engine_messages(self._sessions.get(session_id, ()), utterance)

    def record(self, session_id: str, exchange: Exchange) -> None:
        if self.history_turns == 0:
            return
        kept = self._sessions.setdefault(session_id, [])
        kept.append(clip(exchange, self.history_bytes))
        del kept[:-self.history_turns]
        del kept[:oldest_over(kept, self.history_bytes)]

    def history(self, session_id: str) -> List[Exchange]:
        return list(self._sessions.get(session_id, ()))

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions


def engine_messages(exchanges: Iterable[Exchange], utterance: str) -> List[Tuple[str, str]]:
    """(role, content) pairs for the engine: the answered exchanges, oldest first, then the
    new utterance."""
    out: List[Tuple[str, str]] = []
    for exchange in exchanges:
        if exchange.heard:
            out += [("user", exchange.user), ("assistant", exchange.assistant)]
    return out + [("user", utterance)]


def oldest_over(kept: Sequence[Exchange], limit: int) -> int:
    """How many of the oldest exchanges go so that the rest fit in `limit` bytes (the newest
    always stays)."""
    total, drop = sum(e.size for e in kept), 0
    while len(kept) - drop > 1 and total > limit:
        total -= kept[drop].size
        drop += 1
    return drop


def clip(exchange: Exchange, limit: int) -> Exchange:
    """An exchange within `limit` bytes: the answer's newest part, then the utterance's."""
    if exchange.size <= limit:
        return exchange
    user = _tail(exchange.user, limit // 4)
    return Exchange(user, _tail(exchange.assistant, limit - len(user.encode())), exchange.ended)


def _tail(text: str, limit: int) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[-limit:].decode("utf-8", "ignore")
