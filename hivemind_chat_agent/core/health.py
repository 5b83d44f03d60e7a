"""The hub plugin's health endpoint decided with no I/O: how a turn's end is counted, whether the
hub is ready, and which requests the endpoint answers at all.

- `turn_outcome`: the one place an ended turn becomes the `outcome` label of
  `hivemind_chat_turns_total` (docs/metrics.md). The labels are a contract with dashboards and
  alerts, so every EndReason a turn can end with maps to exactly one of OUTCOMES, and a reason
  added later falls into "failed" rather than into a label nobody queries.
- `readiness` (`ovos_readiness` in the OVOS mode: the bus and ovos-core's skills in place of
  the store and the engine): 200 only while the store answers, the engine is loaded and the
  hub is not draining; otherwise 503 and the first reason, so a load balancer (HAProxy's `option
  httpchk`) sends no new satellite to a replica that could not serve it.
- `as_asked`: a hub that is not ready says 503 to any prober, and 404 to one that asks for
  it with `/readyz?not_ready=404` (config/haproxy.cfg's check): HAProxy's `http-check
  disable-on-404` then sends it no new satellite but keeps the open connections, where a 503
  marks it down and `on-marked-down shutdown-sessions` cuts them. Cutting is for a replica
  that is gone (its health port silent), not one that waits: a draining hub's turns are
  finishing, and while the store all replicas share fails over (Sentinel: about 2 s) every
  replica is unready at once, so cutting would disconnect every satellite of the tier for
  nothing better to reconnect to.
- `refusal`: the health port is a front like the others, closed by default (docs/security.md):
  only GET of PATHS; on a loopback bind the Host must be a loopback name (a web page whose
  name was rebound to 127.0.0.1 sends its own name: 421); a browser's Origin other than a
  loopback page is refused (403). The metrics carry no secret, but who may read them is the
  operator's choice, not a web page's.
- `front_outcome`: the same label for a turn a front ended (bridges/front_metrics.py).
- `parse_address`: "HOST:PORT" of the `health` setting.
"""
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

from hivemind_chat_agent.core.front_guard import host_name, is_loopback, origin_key
from hivemind_chat_agent.core.turns import EndReason

ANSWERED, ASKED, NOT_UNDERSTOOD, FAILED = "answered", "asked", "not_understood", "failed"
TIMED_OUT, STOPPED, REPLAYED = "timed_out", "stopped", "replayed"
OUTCOMES = (ANSWERED, ASKED, NOT_UNDERSTOOD, FAILED, TIMED_OUT, STOPPED, REPLAYED)

DRAINING_STATUS = 503
NOT_READY_AS_404 = "not_ready=404"   # the query of a prober that reads 404 as "drain"
HEALTHZ, READYZ, METRICS = "/healthz", "/readyz", "/metrics"
PATHS = (HEALTHZ, READYZ, METRICS)

# what a failure's reason counts as; any other reason (busy, engine_error, store_unavailable,
# id_too_long, backend_unavailable, one added later) is "failed"
_BY_REASON = {EndReason.NONE: NOT_UNDERSTOOD, EndReason.NOT_UNDERSTOOD: NOT_UNDERSTOOD,
              EndReason.NO_TEXT: NOT_UNDERSTOOD, EndReason.TIMEOUT: TIMED_OUT}


def turn_outcome(failed: bool, reason: EndReason = EndReason.NONE, stopped: bool = False,
                 replayed: bool = False, asked: bool = False, abandoned: bool = False) -> str:
    """The outcome label of one ended turn. `replayed` (answered from the record of an
    earlier run, the engine not run) wins over how that run ended; a turn whose satellite
    stopped it (`mycroft.stop`) or left before its end (`abandoned`) is "stopped"; a failure
    goes by its reason; otherwise the turn was answered, or `asked` a question."""
    if replayed:
        return REPLAYED
    if abandoned or (stopped and not failed):
        return STOPPED
    if failed:
        return _BY_REASON.get(reason, FAILED)
    return ASKED if asked else ANSWERED


# a front's turn (client/observer.py) by its client-side status; None: never sent
_BY_STATUS = {"answered": ANSWERED, "asked": ASKED, "not_understood": NOT_UNDERSTOOD,
              "cancelled": STOPPED, "timed_out": TIMED_OUT}


def front_outcome(status: Optional[str]) -> str:
    """The outcome label of one turn a front (OpenAI, A2A, MCP, Wyoming) ended, from the
    value of its core/outcomes.TurnStatus: the hub's labels, the same meaning seen from the
    client. `cancelled` (the caller hung up, or gave up before it was sent) is "stopped";
    `lost`, `failed`, a turn never sent (None: no connection, a refused key) and any status
    added later are "failed". The client cannot tell a replayed answer: "replayed" stays 0."""
    return FAILED if status is None else _BY_STATUS.get(str(getattr(status, "value", status)),
                                                    FAILED)


@dataclass(frozen=True)
class Verdict:
    """An HTTP status and the JSON-able reason (`reason` "" when all is well)."""
    status: int
    reason: str = ""
    message: str = ""

    def body(self) -> Dict[str, object]:
        """The JSON answer of `/readyz` (and, with `ready` false, of a refused request)."""
        if self.status == 200:
            return {"ready": True}
        return {"ready": False, "reason": self.reason, "message": self.message}


def readiness(store_answers: bool, engine_loaded: bool, draining: bool) -> Verdict:
    """`/readyz`: ready only when all three allow it; the reason is the first that does not,
    in the order an operator acts on it (a drain is on purpose, the engine is this process's,
    the store is shared)."""
    if draining:
        return Verdict(DRAINING_STATUS, "draining", "the hub is shutting down: its turns are "
                                                    "finishing and new satellites go to "
                                                    "another replica")
    if not engine_loaded:
        return Verdict(503, "engine_not_loaded", "the chat engine is not loaded")
    if not store_answers:
        return Verdict(503, "store_unavailable", "the conversation store does not answer; "
                                                 "turns fail until it is back")
    return Verdict(200)


def as_asked(verdict: Verdict, target: str) -> Verdict:
    """`verdict` as the prober of `target` asked to hear it: 404 for any reason not to be
    ready when its query has `not_ready=404` (HAProxy's disable-on-404), else unchanged."""
    if verdict.status == 503 and NOT_READY_AS_404 in target.partition("?")[2].split("&"):
        return Verdict(404, verdict.reason, verdict.message)
    return verdict


def ovos_readiness(ovos_answers: bool, why: str, draining: bool) -> Verdict:
    """`/readyz` in the OVOS mode: ready while the local ovos-core takes utterances (its
    messagebus connected and its skills ready: `why` says which is not) and not draining."""
    if draining:
        return readiness(True, True, draining)
    if not ovos_answers:
        return Verdict(503, "ovos_unavailable", f"{why}; utterances are refused until it is")
    return Verdict(200)


def refusal(method: str, target: str, headers: Mapping[str, str],
            loopback_bind: bool) -> Optional[Verdict]:
    """None to serve `target` (its path is one of PATHS), else what to answer. `headers` have
    lower-case names."""
    path = target.split("?", 1)[0]
    if loopback_bind:
        host = headers.get("host")
        if host is None or not is_loopback(host_name(host)):
            return Verdict(421, "host_not_allowed", "this health endpoint answers loopback "
                                                    "names only (localhost, 127.0.0.1, ::1)")
    origin = headers.get("origin")
    if origin is not None:
        key = origin_key(origin)
        if key is None or not is_loopback(key[1]):
            return Verdict(403, "origin_not_allowed", "web pages may not read this endpoint")
    if method != "GET":
        return Verdict(405, "method_not_allowed", "only GET is answered")
    if path not in PATHS:
        return Verdict(404, "not_found", f"the paths are {', '.join(PATHS)}")
    return None


def parse_address(text: str) -> Tuple[str, int]:
    """("host", port) of "HOST:PORT" ("[::1]:8008" for IPv6; ":8008" or "8008" is loopback);
    ValueError saying what to write otherwise."""
    text = str(text).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f'health must be "HOST:PORT" (e.g. "127.0.0.1:8008"), not {text!r}')
    return host, int(port)
