"""Draining a hub replica before it exits, decided without I/O (issue 27, part 4).

A replica told to stop (SIGTERM: hub/draining.py says how that reaches the plugin) must not cut
what it is doing. `Drain` is the plan, a plain object taking events and giving decisions, with
every time handed in (the shell reads its clock):

- `stop(now, connections)`: the drain begins; the hub is not ready from now on (`/readyz`
  answers "draining", so the load balancer sends no new satellite here), and every idle
  connection is closed, so its satellite reconnects to another replica;
- `admit(connection)`: a turn arrives. While serving it is admitted and counted until
  `turn_ended`; while draining it is refused (the shell answers it with the `draining`
  refusal, the turn never ran, and the client sends it to another replica at once);
- `turn_ended(connection, now, connections)`, `refused(...)`: a connection whose last turn is
  over is idle now, and is closed;
- `connected(connection, now)`: a satellite that reaches the replica during the drain (the
  load balancer had not noticed yet) gets `HANDSHAKE_GRACE` seconds to finish its handshake
  and send its turn (which is refused) before it is closed as idle: a connection closed in its
  handshake reads to a client as "the hub does not know this access key";
- `running_now(turns, now, connections)`: for a shell that counts its turns itself (the OVOS
  mode: its routes know which utterances ovos-core has not handled yet), the admitted turns
  of each connection now, in place of `admit`/`turn_ended`;
- `tick(now, connections)`: the clock; the drain ends when no admitted turn is running and no
  newcomer is in its grace, or at `timeout` seconds after it began (the turns still running
  are cut: `Decision.cut`).

`connections` is what the hub has open now (any hashable names); a decision names which of
them to close, and whether the drain is over (`exit`: close the rest, shut down, exit).
"""
from dataclasses import dataclass
from enum import Enum
from typing import Dict, FrozenSet, Hashable, Iterable, Mapping, Optional, Set

DRAIN_TIMEOUT = 20.0     # seconds the turns running at SIGTERM get to finish
HANDSHAKE_GRACE = 5.0    # seconds a connection opened during the drain is left alone


class Phase(str, Enum):
    SERVING = "serving"
    DRAINING = "draining"
    DONE = "done"


@dataclass(frozen=True)
class Decision:
    close: FrozenSet[Hashable] = frozenset()   # connections to close now
    exit: bool = False      # the drain is over: close every connection, shut down, exit
    cut: int = 0            # turns still running when it ended (the timeout passed)


NOTHING = Decision()


class Drain:
    def __init__(self, timeout: float = DRAIN_TIMEOUT, grace: float = HANDSHAKE_GRACE):
        if timeout < 0:
            raise ValueError("drain_timeout must be >= 0")
        self.timeout = timeout
        self.grace = grace
        self.phase = Phase.SERVING
        self.began: Optional[float] = None
        self.ended: Optional[float] = None
        self.cut = 0              # turns still running when it ended
        self._turns: Dict[Hashable, int] = {}        # connection -> its admitted turns open
        self._closed: Set[Hashable] = set()          # closed by a decision already
        self._arrived: Dict[Hashable, float] = {}    # connected during the drain, when

    @property
    def draining(self) -> bool:
        """Not ready: the drain began (and may be over)."""
        return self.phase is not Phase.SERVING

    @property
    def over(self) -> bool:
        """The drain ended (whichever event ended it): the shell exits."""
        return self.phase is Phase.DONE

    @property
    def running(self) -> int:
        """Admitted turns not ended yet."""
        return sum(self._turns.values())

    def stop(self, now: float, connections: Iterable[Hashable]) -> Decision:
        """The replica was told to stop; a second stop changes nothing."""
        if self.phase is not Phase.SERVING:
            return NOTHING
        self.phase, self.began = Phase.DRAINING, now
        return self._decide(now, connections)

    def admit(self, connection: Hashable) -> bool:
        """True: run the turn (it counts until `turn_ended`); False: refuse it, draining."""
        if self.phase is not Phase.SERVING:
            return False
        self._turns[connection] = self._turns.get(connection, 0) + 1
        return True

    def turn_ended(self, connection: Hashable, now: float,
                   connections: Iterable[Hashable]) -> Decision:
        """An admitted turn of `connection` ended (whichever way)."""
        left = self._turns.get(connection, 0) - 1
        if left > 0:
            self._turns[connection] = left
        else:
            self._turns.pop(connection, None)
        return self._decide(now, connections)

    def running_now(self, turns: Mapping[Hashable, int], now: float,
                    connections: Iterable[Hashable]) -> Decision:
        """The turns each connection has running now, as the shell counted them."""
        self._turns = {c: n for c, n in turns.items() if n > 0}
        return self._decide(now, connections)

    def refused(self, now: float, connections: Iterable[Hashable]) -> Decision:
        """A turn was refused (the refusal is on its way): its connection may be idle now."""
        return self._decide(now, connections)

    def connected(self, connection: Hashable, now: float) -> None:
        """A satellite connected; during the drain it gets the handshake grace."""
        if self.phase is Phase.DRAINING:
            self._arrived[connection] = now

    def disconnected(self, connection: Hashable) -> None:
        """A connection went (its turns were ended by the hub, or are abandoned)."""
        self._closed.discard(connection)
        self._arrived.pop(connection, None)

    def tick(self, now: float, connections: Iterable[Hashable]) -> Decision:
        return self._decide(now, connections)

    def _decide(self, now: float, connections: Iterable[Hashable]) -> Decision:
        if self.phase is not Phase.DRAINING or self.began is None:
            return NOTHING
        open_now = frozenset(connections)
        running = self.running
        settling = any(now < self._arrived.get(c, now - self.grace) + self.grace
                       for c in open_now - self._closed)
        if (running == 0 and not settling) or now >= self.began + self.timeout:
            self.phase, self.ended, self.cut = Phase.DONE, now, running
            close = open_now - self._closed
            self._closed |= close
            return Decision(close=close, exit=True, cut=running)
        idle = frozenset(c for c in open_now
                         if not self._turns.get(c) and c not in self._closed
                         and now >= self._arrived.get(c, now - self.grace) + self.grace)
        self._closed |= idle
        return Decision(close=idle) if idle else NOTHING

    def next_tick(self, now: float) -> float:
        """Seconds until something can change without an event: the timeout, or the end of a
        newcomer's grace (at most a second, the shell's check of its clock)."""
        if self.phase is not Phase.DRAINING or self.began is None:
            return 1.0
        due = [self.began + self.timeout] + [t + self.grace for t in self._arrived.values()]
        return max(0.0, min(1.0, min(due) - now))
