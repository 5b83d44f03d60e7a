"""Bounds on the identifiers that cross the HiveMind link, shared by both sides, without I/O.

A satellite declares its session id and our client tags each turn with an id; the hub keys its
engine sessions, transcripts, Sessions and turn records by them (in memory and in Redis key
names). Unbounded, one satellite could make every one of those as large as it likes, and every
log line that names them too (docs/performance.md#why-the-code-is-as-it-is). So both are
bounded: the client refuses a longer session id before sending anything, and the hub plugin
refuses a turn, QUERY or stop that carries one, saying why, in one bounded log line.
"""

MAX_ID_BYTES = 256       # a declared session id or a turn id, UTF-8 encoded
SHOWN_CHARS = 32         # what a log line or an error shows of a value (then its length)
NAME_CHARS = 96          # what a log line shows of a peer's name (hivemind-core's, from HELLO)


def id_bytes(value: str) -> int:
    """The UTF-8 length of `value` (lone surrogates, which JSON can carry, count as 3)."""
    return len(value.encode("utf-8", "surrogatepass"))


def over_bound(value: str, bound: int = MAX_ID_BYTES) -> bool:
    """Is `value` longer than `bound` bytes of UTF-8? Cheap for short values: a string of at
    most bound/4 characters cannot be over, and one of more than `bound` characters is."""
    if len(value) * 4 <= bound:
        return False
    if len(value) > bound:
        return True
    return id_bytes(value) > bound


def id_refusal(what: str, value: str, bound: int = MAX_ID_BYTES) -> str:
    """Why the id `value` cannot be kept ("" when it can): over `bound` bytes, or not UTF-8
    at all (a lone surrogate, which JSON can carry and no Redis key name can)."""
    if over_bound(value, bound):
        return too_long(what, value, bound)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"the {what} {shown(value)} is not valid UTF-8; use another {what}"
    return ""


def shown(value: object, keep: int = SHOWN_CHARS, quote: bool = True) -> str:
    """`value` as a log line or an error message may quote it: escaped (no newline or control
    character of a sender's can forge a line) and, when long, its first `keep` characters and
    its length, so no sender decides how long a line is. `quote=False` leaves printable text
    as it is (a peer name in a line that always showed it bare)."""
    text = value if isinstance(value, str) else str(value)
    head = text[:keep]
    head = repr(head) if quote else "".join(c if c.isprintable() else repr(c)[1:-1]
                                            for c in head)
    return head if len(text) <= keep else f"{head}… ({id_bytes(text)} bytes)"


def shown_name(peer: object) -> str:
    """A connection's name (its peer string, which carries the HELLO's session id) as a log
    line shows it: bare when short and printable, bounded always."""
    return shown(peer, NAME_CHARS, quote=False)


def too_long(what: str, value: str, bound: int = MAX_ID_BYTES) -> str:
    """Why `value` is refused, for the sender and the log: bounded, whatever its length."""
    return (f"the {what} {shown(value)} is over {bound} bytes of UTF-8; use a shorter "
            f"{what}")
