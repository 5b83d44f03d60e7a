"""Who may use an HTTP front (`hivemind-chat openai`, `hivemind-chat mcp --http`), decided with
no I/O: request headers and the peer's address in, a refusal or the caller's name out.

An OVOS hub runs skills with side effects ("unlock the door"), and anyone who reaches a front
talks to the hub as this client. So, before a body is read:

- `Host` must name this server: a loopback name, the address it is bound to, or one the
  operator allowed. Anything else is 421: a page whose name was rebound to 127.0.0.1 (DNS
  rebinding) sends its own name.
- A browser's `Origin` must be a loopback page or one the operator allowed, else 403: any web
  page can POST a CORS-simple request to a loopback server; only the Origin tells.
- A request with a body must say `application/json` (415): `text/plain` is what a page sends
  to avoid a CORS preflight.
- With keys configured, the Bearer token must be one of them (401); each key is its own
  caller, so conversations of one key are never reached with another. Repeated 401s from one
  peer are throttled (429 with Retry-After): guessing keys costs time.

`turns` caps requests in flight per caller (429): one caller never fills the hub for others.
"""
import hashlib
import hmac
import ipaddress
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost (brackets allowed)."""
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a Host header, lower case, without the port or IPv6 brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else ""
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def origin_key(origin: str) -> Optional[Tuple[str, str, Optional[int]]]:
    """(scheme, host, port) of an Origin or of an allowed origin; None if it is not one."""
    try:
        parts = urlsplit(origin.strip().rstrip("/").lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, parts.hostname, port if port is not None else default


@dataclass(frozen=True)
class Refusal:
    """What to answer instead of serving: an HTTP status, a message saying what to do, a
    machine-readable code, and for 429s the seconds to wait."""
    status: int
    message: str
    code: str
    retry_after: Optional[int] = None


class Keys:
    """The API keys a front accepts; each is its own caller (a namespace of conversations).
    No keys: everyone is the one anonymous caller "" (loopback only, see `check_exposure`)."""

    def __init__(self, keys: Iterable[str] = ()):
        self._keys = [k.encode() for k in dict.fromkeys(k.strip() for k in keys) if k]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def caller(self, authorization: str) -> Optional[str]:
        """The caller named by an `Authorization: Bearer` header; None if no key matches.
        Every key is compared, in constant time each, so timing tells nothing."""
        if not self._keys:
            return ""
        token = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
        found = None
        for key in self._keys:
            if hmac.compare_digest(token.encode(), key):
                found = key
        return None if found is None else "key-" + hashlib.sha256(found).hexdigest()[:16]


class FailureThrottle:
    """Slows down a peer that keeps sending wrong keys: `burst` failures at once, then one per
    `every` seconds (a token bucket per peer address; the table holds `max_peers`)."""

    def __init__(self, burst: int = 10, every: float = 1.0, max_peers: int = 4096,
                 clock: Callable[[], float] = time.monotonic):
        self.burst, self.every, self.max_peers, self.clock = burst, every, max_peers, clock
        self._tokens: "OrderedDict[str, Tuple[float, float]]" = OrderedDict()

    def wait_for(self, peer: str) -> Optional[int]:
        """Seconds `peer` must wait before its key is checked again, or None."""
        tokens = self._level(peer)
        if tokens >= 1:
            return None
        return max(1, int((1 - tokens) * self.every + 0.999))

    def failed(self, peer: str) -> None:
        self._tokens[peer] = (self._level(peer) - 1, self.clock())
        self._tokens.move_to_end(peer)
        while len(self._tokens) > self.max_peers:
            self._tokens.popitem(last=False)

    def _level(self, peer: str) -> float:
        tokens, since = self._tokens.get(peer, (float(self.burst), self.clock()))
        return min(float(self.burst), tokens + (self.clock() - since) / self.every)


class InFlight:
    """Requests in flight per caller, at most `limit` each."""

    def __init__(self, limit: int):
        self.limit = limit
        self._count: Dict[str, int] = {}

    def begin(self, caller: str) -> bool:
        if self._count.get(caller, 0) >= self.limit:
            return False
        self._count[caller] = self._count.get(caller, 0) + 1
        return True

    def end(self, caller: str) -> None:
        left = self._count.get(caller, 0) - 1
        if left > 0:
            self._count[caller] = left
        else:
            self._count.pop(caller, None)

    def __len__(self) -> int:
        return sum(self._count.values())


class FrontGuard:
    """The checks above for one front. `bind_host`: the address it listens on (its name is an
    allowed Host); `allowed_hosts` / `allowed_origins`: what the operator added;
    `turns_per_caller`: requests in flight each caller may have."""

    def __init__(self, bind_host: str, keys: Keys = Keys(), allowed_hosts: Iterable[str] = (),
                 allowed_origins: Iterable[str] = (), turns_per_caller: int = 64,
                 throttle: Optional[FailureThrottle] = None, what: str = "server"):
        self.keys = keys
        self.what = what
        self.hosts = {host_name(h) for h in [bind_host, *allowed_hosts] if h}
        self.hosts.discard("0.0.0.0")
        self.hosts.discard("::")
        self.origins: List[Tuple[str, str, Optional[int]]] = []
        for origin in allowed_origins:
            key = origin_key(origin)
            if key is None:
                raise ValueError(f"not an origin: {origin!r} (like https://chat.example.org)")
            self.origins.append(key)
        self.throttle = throttle or FailureThrottle()
        self.in_flight = InFlight(turns_per_caller)

    def host_allowed(self, host: str) -> bool:
        name = host_name(host)
        return bool(name) and (is_loopback(name) or name in self.hosts)

    def origin_allowed(self, origin: Optional[str]) -> bool:
        if origin is None:          # not a browser (or a same-origin GET): nothing to tell
            return True
        key = origin_key(origin)
        return key is not None and (is_loopback(key[1]) or key in self.origins)

    def admit(self, headers: Mapping[str, str], peer: str, has_body: bool,
              public: bool = False) -> Tuple[Optional[str], Optional[Refusal]]:
        """(caller, None) to serve the request, or (None, refusal). `headers` have lower-case
        names; nothing of the body is needed. `public`: a page anyone may read (an A2A agent
        card, which says that the rest needs a key): Host and Origin are checked, the key is
        not, and the caller is the anonymous one."""
        if not self.host_allowed(headers.get("host", "")):
            return None, Refusal(421, f"this {self.what} does not answer for the host "
                                 f"{headers.get('host', '')[:100]!r}: start it with "
                                 "--allowed-host NAME for a name other than loopback or its "
                                 "address", "host_not_allowed")
        if not self.origin_allowed(headers.get("origin")):
            return None, Refusal(403, f"requests from web pages at "
                                 f"{headers.get('origin', '')[:100]!r} are refused: start "
                                 "the server with --allowed-origin ORIGIN to allow that "
                                 "page", "origin_not_allowed")
        if has_body and headers.get("content-type", "").split(";")[0].strip().lower() \
                != "application/json":
            return None, Refusal(415, "the body must be JSON, sent with 'Content-Type: "
                                 "application/json'", "unsupported_media_type")
        if public:
            return "", None
        return self._caller(headers.get("authorization", ""), peer)

    def _caller(self, authorization: str, peer: str
                ) -> Tuple[Optional[str], Optional[Refusal]]:
        if not self.keys:
            return "", None
        wait = self.throttle.wait_for(peer)
        if wait is not None:
            return None, Refusal(429, f"too many wrong API keys from {peer}: wait {wait} s",
                                 "too_many_wrong_keys", retry_after=wait)
        caller = self.keys.caller(authorization)
        if caller is None:
            self.throttle.failed(peer)
            return None, Refusal(401, "Incorrect API key provided: pass one of the server's "
                                 "keys as 'Authorization: Bearer <key>'", "invalid_api_key")
        return caller, None

    def begin_turn(self, caller: str) -> Optional[Refusal]:
        """Take a place for one of `caller`'s requests; `end_turn` gives it back."""
        if self.in_flight.begin(caller):
            return None
        return Refusal(429, f"this caller already has {self.in_flight.limit} requests in "
                       "flight: wait for one to finish", "too_many_requests", retry_after=1)

    def end_turn(self, caller: str) -> None:
        self.in_flight.end(caller)
