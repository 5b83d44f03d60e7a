"""PendingAnswers: what an MCP `ask` has returned of a turn and what is left (sans-I/O).

MCP clients give a tool call a time budget (Home Assistant: 10 s per call, a new MCP session per
call). A turn still speaking at the budget is returned in part (`complete: false`) and goes on
at the hub; the next `ask` of the same caller and conversation with an empty utterance
collects what was said since. This object is that bookkeeping, keyed by (caller, conversation)
and never by an MCP session; the front (bridges/mcp_asks.py) feeds it the turn's sentences and
its end, and stops the turns it names.

- Each turn gets a token (`begin`): everything else is by token, so a collector of an older
  turn never takes the sentences of a newer one in the same conversation.
- `take` hands out every sentence not handed out before, exactly once, in order.
- Bounds: a turn nobody collects is forgotten `keep_for` seconds after its last portion
  (`expired`: the front stops it at the hub); a caller has at most `per_caller` turns kept and
  everyone together at most `limit` (`begin` names the oldest uncollected ones to stop); a new
  turn in a conversation replaces the one pending there.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

Key = Tuple[str, str]           # (caller, conversation)


@dataclass(frozen=True)
class Portion:
    """What one `ask` returns of a turn: the sentences not returned before; `complete` once
    the turn has ended (then `expect_response`: it ended with a skill's question); `error`:
    the failure of a turn that ended having said nothing at all."""
    sentences: Tuple[str, ...]
    complete: bool
    expect_response: bool = False
    error: Optional[BaseException] = None


@dataclass
class _Kept:
    key: Key
    sentences: List[str] = field(default_factory=list)
    returned: int = 0
    ended: bool = False
    asked: bool = False
    error: Optional[BaseException] = None
    collecting: bool = True            # an ask is waiting on it: no deadline meanwhile
    deadline: Optional[float] = None   # when uncollected, forgotten after this


class PendingAnswers:
    """Turns of MCP `ask` calls, from their start until their last portion is taken or they
    are forgotten. `now`: the clock (seconds, monotonic)."""

    def __init__(self, now: Callable[[], float], keep_for: float = 60.0,
                 per_caller: int = 4, limit: int = 1000):
        if keep_for <= 0 or per_caller < 1 or limit < 1:
            raise ValueError("keep_for must be above 0, per_caller and limit at least 1")
        self._now = now
        self.keep_for = keep_for
        self.per_caller = per_caller
        self.limit = limit
        self._kept: Dict[int, _Kept] = {}          # token -> turn, oldest first
        self._by_key: Dict[Key, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._kept)

    def begin(self, caller: str, conversation: str) -> Tuple[int, List[int]]:
        """A new turn of (caller, conversation), being collected by the `ask` that began it.
        Returns its token and the tokens forgotten to make room: the turn pending in that
        conversation (replaced), then the oldest uncollected turns of the caller past
        `per_caller` and of everyone past `limit`. The front stops those at the hub."""
        key = (caller, conversation)
        dropped: List[int] = []
        previous = self._by_key.get(key)
        if previous is not None:
            self._forget(previous)
            dropped.append(previous)
        dropped += self._make_room(lambda kept: kept.key[0] == caller, self.per_caller)
        dropped += self._make_room(lambda kept: True, self.limit)
        token = self._next
        self._next += 1
        self._kept[token] = _Kept(key)
        self._by_key[key] = token
        return token, dropped

    def _make_room(self, counts: Callable[[_Kept], bool], cap: int) -> List[int]:
        """Forget the oldest uncollected turns that `counts` until one more fits under `cap`
        (turns being collected are never taken from under their ask: the fronts' own cap on
        calls in flight bounds those)."""
        mine = [token for token, kept in self._kept.items() if counts(kept)]
        over = len(mine) + 1 - cap
        dropped = [token for token in mine if not self._kept[token].collecting][:max(0, over)]
        for token in dropped:
            self._forget(token)
        return dropped

    def find(self, caller: str, conversation: str) -> Optional[int]:
        """The token of the turn kept for (caller, conversation), if any."""
        return self._by_key.get((caller, conversation))

    def said(self, token: int, sentence: str) -> None:
        """The turn spoke `sentence` (ignored once it is forgotten)."""
        kept = self._kept.get(token)
        if kept is not None and not kept.ended:
            kept.sentences.append(sentence)

    def ended(self, token: int, asked: bool = False,
              error: Optional[BaseException] = None) -> None:
        """The turn is over: `asked` a skill's question ends it; `error`: how it failed."""
        kept = self._kept.get(token)
        if kept is not None and not kept.ended:
            kept.ended, kept.asked, kept.error = True, asked, error

    def is_over(self, token: int) -> bool:
        """Whether there is nothing more to wait for: the turn ended, or it is forgotten."""
        kept = self._kept.get(token)
        return kept is None or kept.ended

    def collect(self, token: int) -> bool:
        """An `ask` with an empty utterance comes for the rest: no deadline while it waits.
        False when the turn is forgotten."""
        kept = self._kept.get(token)
        if kept is None:
            return False
        kept.collecting, kept.deadline = True, None
        return True

    def take(self, token: int) -> Optional[Portion]:
        """The sentences said since the last portion (each handed out once), and whether that
        is the end. An ended turn is forgotten with its last portion; one still speaking is
        kept until `keep_for` from now. None when the turn is forgotten (replaced, dropped)."""
        kept = self._kept.get(token)
        if kept is None:
            return None
        new = tuple(kept.sentences[kept.returned:])
        kept.returned = len(kept.sentences)
        if kept.ended:
            self._forget(token)
            silent = not kept.sentences
            return Portion(new, True, kept.asked, kept.error if silent else None)
        kept.collecting, kept.deadline = False, self._now() + self.keep_for
        return Portion(new, False)

    def expired(self) -> List[int]:
        """Forget the uncollected turns whose deadline has passed; their tokens (the front
        stops those still running)."""
        now = self._now()
        gone = [token for token, kept in self._kept.items()
                if kept.deadline is not None and kept.deadline <= now]
        for token in gone:
            self._forget(token)
        return gone

    def next_deadline(self) -> Optional[float]:
        """The earliest deadline of an uncollected turn, if any (when to look again)."""
        deadlines = [kept.deadline for kept in self._kept.values() if kept.deadline is not None]
        return min(deadlines) if deadlines else None

    def drop(self, token: int) -> None:
        """Forget the turn (its caller hung up, or it was stopped)."""
        self._forget(token)

    def _forget(self, token: int) -> None:
        kept = self._kept.pop(token, None)
        if kept is not None and self._by_key.get(kept.key) == token:
            del self._by_key[kept.key]


__all__ = ["PendingAnswers", "Portion"]
