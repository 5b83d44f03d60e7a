"""Loopback ports for the servers the tests start, each handed out once.

`free_port()` used to bind port 0 and close: the kernel's pick, free at that moment. Two
such calls can return the same port (measured here: 3 of 2,000 runs of five back-to-back
calls repeated one), and a SentinelSet chooses five ports before it starts anything: a CI
run gave a replica and a sentinel the same port, the sentinel could not bind and exited,
and its readiness ping was answered by the replica. The same kernel pick also serves every
outgoing connection's local port, so a port chosen that way may be taken by some client's
socket before its server binds it.

So the ports come from below the ephemeral range (net.ipv4.ip_local_port_range), which
neither bind(0) nor connect() ever picks, at random, and a port once handed out in this
process is never handed out again (the suite needs a few thousand of over ten thousand).
A port is handed out only if it can be bound at that moment (nothing else serves on it)."""
import random
import socket
import threading

LOWEST = 20000
"""Below it are the well-known defaults of what the tests' neighbours may run (8181 OVOS's
bus, 5678 HiveMind, 6379 Redis, 1883 MQTT, 8123 Home Assistant, 10200 Wyoming)."""

_handed_out: "set[int]" = set()
_random = random.Random()   # its own: a test that seeds the module's would repeat the picks
_lock = threading.Lock()


def _ephemeral_range() -> "tuple[int, int]":
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(word) for word in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999          # Linux's default


def _candidates() -> range:
    """Ports no kernel pick can take: below the ephemeral range, or above it when it starts
    too low to leave room below (a few thousand ports are needed)."""
    low, high = _ephemeral_range()
    if low - LOWEST >= 4000:
        return range(LOWEST, low)
    if 65535 - high >= 4000:
        return range(high + 1, 65536)
    raise RuntimeError(f"the ephemeral port range {low}-{high} leaves no room for the "
                       "tests' servers; narrow net.ipv4.ip_local_port_range")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing serves on, not handed out before in this process, outside
    the range the kernel picks from for bind(0) and outgoing connections."""
    candidates = _candidates()
    with _lock:
        for _ in range(1000):
            port = _random.choice(candidates)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    raise RuntimeError(f"no free port in {candidates.start}-{candidates.stop - 1}")
