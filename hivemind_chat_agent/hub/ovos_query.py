"""hivemind-core's QUERY and CASCADE answered by ovos-core in OVOS mode, as the stock
hivemind-ovos-agent-plugin (0.5.3a1) answers them.

hivemind-core 5.x admits the QUERY's utterance through its policy chain, then calls the
plugin's `answer_query(utterance, lang, client)` on a worker thread of its own and relays each
sentence it yields as a `speak`, ending at the first None (a None first is a decline: core may
escalate). Here, as in the stock plugin, the utterance goes to the OVOS bus under a Session of
its own (`session_id` = a fresh query id, so no satellite's Session is read or written and
nothing of the answer is routed to a satellite), with `context["query_id"]`; every `speak`
OVOS sends with that query id is a sentence, and its `ovos.utterance.handled` ends the answer.
The client's policy applies as the stock plugin applies it: hivemind-core's own chain reviews
the query's Session for that client, so the skill and intent blacklists it keeps for the client
(OVOSAgentPolicy) are in it; a denial is a decline, and the utterance never reaches OVOS.

No satellite plays a QUERY's speech, so this side reports it played: after each sentence a
`recognizer_loop:audio_output_end` for the query's Session, repeated at doubling gaps (0.25 s up
to 1 s) while the answer is open, as our client does for its turns (client/satellite_reports.py:
a skill's `wait_while_speaking` may subscribe after the first one). Without it, a skill that
speaks with wait=True (ovos-core's hello-world) holds its handled for about 15 s.

Bounds: at most `max_queries` answers at once (another is declined), each ends after `timeout`
seconds without a sentence (the stock plugin's 10 s) and after `total` seconds in all, and
declines at once while the bus is down.
"""
import json
import queue
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, Optional

from ovos_utils.log import LOG

from hivemind_chat_agent.core.ovos_replies import TWIN_MARKERS
from hivemind_chat_agent.core.protocol_names import (
    AUDIO_OUTPUT_END_TYPE,
    CURRENT_UTTERANCE_TYPE,
    HANDLED_TYPE,
    UTTERANCE_TYPE,
)
from hivemind_chat_agent.hub.ovos_bus import BusNotConnected

SPEAK_TYPES = ("speak", "ovos.utterance.speak")
AUDIO_END_ECHO, AUDIO_END_ECHO_MAX = 0.25, 1.0   # as client/satellite_reports.py
QUERY_ID_MARKERS = (b'"query_id"', '"query_id"')
_END = object()


class OvosQueries:
    """The answers in progress, by query id. `stream()` runs on hivemind-core's query
    worker; `deliver()` on the bus thread."""

    def __init__(self, send: Callable[[str], None], timeout: float = 10.0,
                 total: float = 60.0, max_queries: int = 8, now=time.monotonic):
        self._send = send
        self.timeout, self.total, self.max_queries = timeout, total, max_queries
        self._now = now
        self._lock = threading.Lock()
        self._answers: Dict[str, "queue.Queue[Any]"] = {}

    def pending(self) -> bool:
        return bool(self._answers)

    def deliver(self, message: Dict[str, Any]) -> bool:
        """Bus thread: True when `message` belongs to a query in progress (and was taken)."""
        context = message.get("context")
        if not isinstance(context, dict) or not isinstance(context.get("query_id"), str):
            return False
        qid = context["query_id"]
        with self._lock:
            answer = self._answers.get(qid)
        if answer is None:
            return False
        msg_type = message.get("type")
        if msg_type == HANDLED_TYPE:
            answer.put(_END)
        elif msg_type in SPEAK_TYPES and not any(context.get(m) for m in TWIN_MARKERS):
            data = message.get("data")         # a renamed topic's twin is the same sentence
            sentence = data.get("utterance") if isinstance(data, dict) else None
            if isinstance(sentence, str) and sentence.strip():
                answer.put(sentence)
        return True

    def stream(self, utterance: str, lang: str,
               session: Dict[str, Any]) -> Iterator[Optional[str]]:
        """The sentences OVOS speaks for `utterance` under `session` (whose id is the query
        id), then exactly one None."""
        qid = session["session_id"]
        answer: "queue.Queue[Any]" = queue.Queue()
        with self._lock:
            full = len(self._answers) >= self.max_queries
            if not full:
                self._answers[qid] = answer
        if full:
            LOG.warning(f"OVOS mode: declining a QUERY, {self.max_queries} already answering")
            yield None
            return
        try:
            self._send(json.dumps({"type": UTTERANCE_TYPE,
                                   "data": {"utterances": [utterance], "lang": lang},
                                   "context": {"query_id": qid, "session": session}}))
        except BusNotConnected:
            LOG.warning("OVOS mode: declining a QUERY, the OVOS messagebus is down")
            with self._lock:
                self._answers.pop(qid, None)
            yield None
            return
        try:
            yield from self._sentences(answer, session)
        finally:
            with self._lock:
                self._answers.pop(qid, None)

    def _sentences(self, answer: "queue.Queue[Any]",
                   session: Dict[str, Any]) -> Iterator[Optional[str]]:
        now = self._now()
        deadline, quiet_until = now + self.total, now + self.timeout
        echo_at: Optional[float] = None       # when the next audio end is due, once spoken
        gap = AUDIO_END_ECHO
        while True:
            now = self._now()
            if echo_at is not None and now >= echo_at:
                self._audio_end(session)
                echo_at, gap = now + gap, min(AUDIO_END_ECHO_MAX, gap * 2)
            end = min(deadline, quiet_until)
            if now >= end:
                LOG.info("OVOS mode: a QUERY's answer ended without its handled (timeout)")
                yield None
                return
            try:
                item = answer.get(timeout=min(end, echo_at or end) - now)
            except queue.Empty:
                continue
            if item is _END:
                yield None
                return
            self._audio_end(session)
            echo_at, gap = self._now() + AUDIO_END_ECHO, AUDIO_END_ECHO * 2
            quiet_until = self._now() + self.timeout
            yield item

    def _audio_end(self, session: Dict[str, Any]) -> None:
        try:
            self._send(json.dumps({"type": AUDIO_OUTPUT_END_TYPE, "data": {},
                                   "context": {"query_id": session["session_id"],
                                               "session": session}}))
        except BusNotConnected:
            pass      # the answer ends by its timeout; nothing else to tell anyone


def query_session(hm_protocol: Any, client: Any, utterance: str,
                  lang: str) -> Optional[Dict[str, Any]]:
    """A fresh query-scoped Session for `client`'s QUERY, as its policy has it (module
    docstring), or None when the policy denies it. Without a client or a policy chain
    (`natural_language_query`, hivemind-core before 5.x) no policy applies."""
    from ovos_bus_client.message import Message
    session: Dict[str, Any] = {"session_id": uuid.uuid4().hex, "lang": lang}
    chain = getattr(hm_protocol, "policy_chain", None)
    if chain is None or client is None:
        return session
    for topic in (UTTERANCE_TYPE, CURRENT_UTTERANCE_TYPE):  # core admitted it on one
        carrier = Message(topic, {"utterances": [utterance], "lang": lang},
                          {"session": dict(session)})
        verdict = chain.review(carrier, client)    # applies its mutations to carrier
        if not verdict.denied:
            break
    else:
        LOG.warning(f"OVOS mode: a QUERY not answered: policy {verdict.code}")
        return None
    reviewed = carrier.context.get("session")
    if not isinstance(reviewed, dict):
        return None
    return {**reviewed, "session_id": session["session_id"]}    # the query id stays its id
