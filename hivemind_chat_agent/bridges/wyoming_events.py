"""Reading one Wyoming event from a peer, bounded in size and in time (`hivemind-chat wyoming`).

A Wyoming event is a JSON header line, then an optional JSON data block and a payload whose
sizes the header announces. The wyoming package's own reader trusts those sizes and waits for
ever; this one does not:

- sizes: the header line, the data block and the payload are each at most 64 KiB (Home
  Assistant's transcripts are a few hundred bytes);
- time: a whole event must arrive within `Deadlines.idle` of when the server began waiting for
  it (a connection that sends nothing, or a header a byte at a time, is closed), and once its
  first byte is in, each further read (the rest of the header line, the data block, the
  payload) within `Deadlines.read`;
- shape: anything that is not such an event (not JSON, JSON nested past the interpreter's
  recursion limit, a header that is not an object with a string "type", sizes that are not
  small non-negative integers, a stream cut short) raises `BadEvent` saying which, in words
  fit for one log line. The connection is then closed; nothing else is affected.
"""
import asyncio
import json
from dataclasses import dataclass
from typing import Optional

MAX_LINE = 64 * 1024          # one event header
MAX_DATA = 64 * 1024          # its data block, and its payload (skipped: not ours)


@dataclass(frozen=True)
class Deadlines:
    """Seconds. `idle`: for a whole event, from when the server starts waiting for it.
    `read`: for each read of an event once it has begun (a slow header, a slow data block)."""
    idle: float = 30.0
    read: float = 10.0


class BadEvent(ValueError):
    """What came is not a Wyoming event this server takes; `str()` says what, briefly, and
    quotes nothing of the sender's."""


class EventTimeout(Exception):
    """No complete event within its deadline; `str()` says which deadline passed."""


async def read_event(reader: asyncio.StreamReader, deadlines: Deadlines = Deadlines(),
                     first: bytes = b""):
    """The next event, or None when the peer ended the stream between events. `first`: its
    first byte, already read (by the server's hang-up watch during a turn). Raises BadEvent,
    EventTimeout."""
    from wyoming.event import Event
    loop = asyncio.get_running_loop()
    ends = loop.time() + deadlines.idle

    def bound() -> float:
        """The timeout of the next read: the per-read deadline, within the event's."""
        return max(0.0, min(deadlines.read, ends - loop.time()))

    if not first:
        try:
            first = await asyncio.wait_for(reader.read(1), deadlines.idle)
        except asyncio.TimeoutError:
            raise EventTimeout(f"no complete event in {deadlines.idle:g} s") from None
        if not first:
            return None
    line = first if first == b"\n" else first + await _timed(
        reader.readline(), bound(), "a header line not finished in time")
    header = _json(line, "header")
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise BadEvent("not a Wyoming event (no string \"type\")")
    data = header.get("data") or {}
    size = _size(header, "data_length")
    if not isinstance(data, dict):
        raise BadEvent("its \"data\" is not an object")
    if size:
        extra = _json(await _timed(reader.readexactly(size), bound(),
                                   "a data block not finished in time"), "data block")
        if not isinstance(extra, dict):
            raise BadEvent("its data block is not an object")
        data.update(extra)
    payload = _size(header, "payload_length")
    if payload:
        await _timed(reader.readexactly(payload), bound(), "a payload not finished in time")
    return Event(type=header["type"], data=data)


def _size(header: dict, key: str) -> int:
    size = header.get(key) or 0
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_DATA:
        raise BadEvent(f"its {key} is not a size of at most {MAX_DATA} bytes")
    return size


def _json(raw: bytes, what: str):
    """`raw` parsed; BadEvent for what is not JSON, is cut short, or nests so deep that the
    parser runs out of stack (RecursionError: one log line, never a traceback)."""
    if not raw.endswith(b"\n") and what == "header":
        raise BadEvent("its header line was cut short (the stream ended)")
    try:
        return json.loads(raw)
    except RecursionError:
        raise BadEvent(f"its {what} nests too deep") from None
    except ValueError:      # JSONDecodeError and UnicodeDecodeError
        raise BadEvent(f"its {what} is not JSON") from None


async def _timed(read, timeout: Optional[float], what: str) -> bytes:
    """One read of an event that has begun: within `timeout`; the stream ending or a line
    over MAX_LINE are BadEvent."""
    try:
        return await asyncio.wait_for(read, timeout)
    except asyncio.TimeoutError:
        raise EventTimeout(what) from None
    except asyncio.IncompleteReadError:
        raise BadEvent("the stream ended inside an event") from None
    except (asyncio.LimitOverrunError, ValueError):      # readline past the reader's limit
        raise BadEvent(f"its header line is over {MAX_LINE} bytes") from None


__all__ = ["read_event", "Deadlines", "BadEvent", "EventTimeout", "MAX_LINE", "MAX_DATA"]
