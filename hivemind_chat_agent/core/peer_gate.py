"""Who may open a connection to a front without authentication, and how many, without I/O.

The Wyoming protocol has no authentication at all: whoever reaches the port is answered as this
client of the hub, whose skills have side effects (locks, timers, the smart home). What stands
in for a key is the peer's address, checked the moment a connection is accepted, before a byte
of it is read:

- `AllowList`: the networks (`--allow-from ADDR[/PREFIX]`, IPv4 or IPv6) whose peers may
  connect. Listening beyond loopback without one is a configuration error that says how to
  give one; a loopback bind without one admits loopback peers only.
- `PeerGate`: caps on connections in total and per peer (an allowed peer, or a flood of
  refused ones, must not take every descriptor), and on turns in flight per peer (one allowed
  peer must not take every place the hub gives this client).
- `Notices`: which of many alike log lines to write (the first of a kind, then one summary per
  interval), so a flood of refused or broken connections cannot fill the log.

Plain objects on an injected clock: the server (bridges/wyoming_server.py) asks them and does
the closing and the logging.
"""
import ipaddress
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

from hivemind_chat_agent.errors import ConfigurationError

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def parse_address(text: str) -> Optional[Address]:
    """The address a socket names as its peer ("::ffff:192.0.2.1" is 192.0.2.1, a scope id
    "%eth0" is dropped); None for anything that is not an IP address (a UNIX socket)."""
    try:
        address = ipaddress.ip_address(str(text).split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def is_loopback_bind(host: str) -> bool:
    """Whether a server listening on `host` is reachable from this machine only. "", 0.0.0.0,
    "::" (every interface) and any name but localhost's are not."""
    if host in LOOPBACK_NAMES:
        return True
    address = parse_address(host)
    return address is not None and address.is_loopback


def parse_network(text: str, option: str = "--allow-from") -> Network:
    """ADDR or ADDR/PREFIX as a network; a ConfigurationError saying what is wrong otherwise.
    Host bits set under the prefix (192.168.1.20/24) are allowed: that address's network."""
    try:
        address, _, prefix = text.strip().partition("/")
        base = parse_address(address)
        if base is None:
            raise ValueError(text)
        return ipaddress.ip_network(f"{base}/{prefix}" if prefix else str(base), strict=False)
    except ValueError:
        raise ConfigurationError(
            f"{option} {text!r} is not an IP address or network: give one like 192.168.1.20 "
            f"(one host), 192.168.1.0/24 or fd00::/8") from None


class AllowList:
    """The peers a front admits: `networks`, or, when there are none, loopback peers only."""

    def __init__(self, networks: Iterable[Network] = ()):
        self.networks: Tuple[Network, ...] = tuple(networks)

    @classmethod
    def for_bind(cls, host: str, allow_from: Iterable[str], front: str, example: str,
                 option: str = "--allow-from") -> "AllowList":
        """The allow list of a server listening on `host`. Beyond loopback, `allow_from` must
        name someone: without it, a ConfigurationError that says the front has no
        authentication and shows `example`, the command line with the option."""
        networks = [parse_network(text, option) for text in allow_from]
        if not networks and not is_loopback_bind(host):
            where = host or "every interface"
            raise ConfigurationError(
                f"{front} has no authentication: listening on {where} would answer anyone "
                f"who reaches the port. Name who may connect with {option} ADDR[/PREFIX] "
                f"(repeatable), e.g. `{example}` for the Home Assistant host, or listen on "
                f"127.0.0.1 for this machine only")
        return cls(networks)

    def allows(self, peer: str) -> bool:
        address = parse_address(peer)
        if address is None:
            return False
        if not self.networks:
            return address.is_loopback
        return any(address.version == net.version and address in net for net in self.networks)

    def describe(self) -> str:
        return ", ".join(map(str, self.networks)) if self.networks else "loopback only"


@dataclass(frozen=True)
class Caps:
    """How much one front holds at once. Each at least 1."""
    connections: int = 64            # connections open, from everyone
    connections_per_peer: int = 32   # from one address (Home Assistant opens one per turn)
    turns_per_peer: int = 20         # turns in flight for one address; more wait for a place

    def __post_init__(self) -> None:
        for name in ("connections", "connections_per_peer", "turns_per_peer"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigurationError(f"{name.replace('_', ' ')} must be at least 1, not "
                                         f"{getattr(self, name)!r}")


# why a connection was closed at accept (the keys of Notices and of PeerGate.refused)
NOT_ALLOWED = "not allowed"
OVER_TOTAL = "over the connection cap"
OVER_PEER = "over the per-peer connection cap"


@dataclass
class PeerGate:
    """Connections and turns in flight, counted per peer. `admit` at accept, `release` when
    the connection ends; `try_begin_turn` / `end_turn` around each turn. `allow` None: every
    address may connect (a front whose requests carry keys: bridges/http_front.py)."""
    allow: Optional[AllowList]
    caps: Caps = field(default_factory=Caps)
    open_by_peer: Counter[str] = field(default_factory=Counter)
    turns_by_peer: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)   # reason -> connections refused

    @property
    def open(self) -> int:
        return sum(self.open_by_peer.values())

    def admit(self, peer: str) -> Optional[str]:
        """None: the connection is counted and may be served. Else why it must be closed now
        (NOT_ALLOWED, OVER_TOTAL, OVER_PEER); it is not counted."""
        if self.allow is not None and not self.allow.allows(peer):
            reason = NOT_ALLOWED
        elif self.open >= self.caps.connections:
            reason = OVER_TOTAL
        elif self.open_by_peer[peer] >= self.caps.connections_per_peer:
            reason = OVER_PEER
        else:
            self.open_by_peer[peer] += 1
            return None
        self.refused[reason] += 1
        return reason

    def release(self, peer: str) -> None:
        _decrement(self.open_by_peer, peer)

    def try_begin_turn(self, peer: str) -> bool:
        """True: the turn has its place (end it with `end_turn`); False: the peer has
        `caps.turns_per_peer` in flight already."""
        if self.turns_by_peer[peer] >= self.caps.turns_per_peer:
            return False
        self.turns_by_peer[peer] += 1
        return True

    def end_turn(self, peer: str) -> None:
        _decrement(self.turns_by_peer, peer)


def _decrement(counter: Counter[str], key: str) -> None:
    if counter[key] <= 1:
        counter.pop(key, None)
    else:
        counter[key] -= 1


class Notices:
    """Which log lines of a kind to write: the first one, then at most one per `interval`
    seconds, which says how many alike were left out since. The kinds are few and fixed
    (a refusal's reason, "malformed", ...), never a sender's words."""

    def __init__(self, now: Callable[[], float], interval: float = 60.0):
        self._now = now
        self.interval = interval
        self._last: Dict[str, float] = {}
        self._left_out: Counter[str] = Counter()

    def line(self, kind: str, text: str) -> Optional[str]:
        """`text` to log now (with how many of `kind` were left out before it), or None to
        leave this one out."""
        now = self._now()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._left_out[kind] += 1
            return None
        self._last[kind] = now
        left_out = self._left_out.pop(kind, 0)
        if left_out and last is not None:
            text += f" ({left_out} more alike in the last {now - last:.0f} s)"
        return text


__all__: List[str] = ["AllowList", "Caps", "PeerGate", "Notices", "parse_address",
                      "parse_network", "is_loopback_bind", "NOT_ALLOWED", "OVER_TOTAL",
                      "OVER_PEER"]
