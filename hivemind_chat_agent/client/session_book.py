"""Session bookkeeping: which OVOS Session a turn sends, and what a reply teaches us about it.

The Session of each conversation lives in ovos-bus-client's process-wide `SessionManager`, as
the OVOS chat agents and hivemind agents expect (docs/message_flow.md); this class decides how a
caller's session_id maps to it, what of it goes on the wire, and validates what comes back
before it is stored. An optional `SessionStore` keeps conversations across processes.
"""
import time
from collections import OrderedDict
from typing import Any, Callable, Collection, Dict, Mapping, Optional

from ovos_bus_client.session import Session, SessionManager
from ovos_utils.log import LOG

from hivemind_chat_agent.client.session_store import SessionStore
from hivemind_chat_agent.compat import register_session as register
from hivemind_chat_agent.core.conversation import CONVERSATION_FIELDS, HUB_FIELDS
from hivemind_chat_agent.core.limits import over_bound, too_long
from hivemind_chat_agent.errors import IdentifierTooLongError

# Which skills wait for the user's answer: ovos-bus-client 1.x sends `utterance_states`, 2.x
# `response_mode` as well (OVOS-CONVERSE-1), and reads either.
RESPONSE_MODE_FIELDS = ("utterance_states", "response_mode")

# Shapes of the serialized Session fields the pipeline reads; a reply that breaks them is not
# stored (Session.deserialize would take it and fail later, in some skill, on the next turn).
_FIELD_TYPES = {
    "active_skills": list, "utterance_states": dict, "context": dict, "lang": str,
    "site_id": str, "pipeline": list, "blacklisted_skills": list,
    "blacklisted_intents": list, "persona_id": str, "system_unit": str,
    "location": dict, "is_speaking": bool, "is_recording": bool,
}


def malformed_fields(data: Mapping[str, Any]) -> list:
    """The fields of a serialized Session whose shape the pipeline could not read."""
    return [k for k, kinds in _FIELD_TYPES.items()
            if data.get(k) is not None and not isinstance(data[k], kinds)]


class SessionBook:
    def __init__(self, default_session_id: str, site_id: Optional[str] = None,
                 store: Optional[SessionStore] = None, max_sessions: int = 10_000,
                 idle_ttl: float = 3600.0, clock: Callable[[], float] = time.monotonic):
        # "default" is ovos-core's own in-process session, and a 4.0 hub drops non-admin clients
        # that use it; a caller's "default" conversation gets this stable id instead.
        self.default_session_id = default_session_id
        self.site_id = site_id
        self.store = store
        # the Session each hub last sent, as it sent it: it goes back unchanged (bar what the
        # caller sets), because re-serializing it through this process's ovos-bus-client can
        # change it (2.x re-keys 1.x intent context, so a 4.0 hub's skills lose their context)
        # (each dict is replaced, never changed: the socket thread writes, turns read)
        self._from_hub: Dict[str, Dict[str, Any]] = {}
        self._caller: Dict[str, Dict[str, str]] = {}   # fields the caller set, per session
        # ovos-bus-client's SessionManager keeps every Session forever: a persona serving many
        # users would grow without bound. Sessions we put there are tracked here, least
        # recently used first, and forgotten past `max_sessions` or after `idle_ttl`.
        self.max_sessions = max_sessions
        self.idle_ttl = idle_ttl
        self._clock = clock
        self._used: "OrderedDict[str, float]" = OrderedDict()

    def resolve(self, session_id: Optional[str]) -> str:
        """The session id a caller's `session_id` stands for; IdentifierTooLongError past
        core/limits.MAX_ID_BYTES (hubs running our plugin refuse such ids, and every layer on
        the way would keep and log them), before anything is sent."""
        if not session_id or session_id == "default":
            sid = self.default_session_id     # default_session_id of the config, too
        else:
            sid = str(session_id)
        if over_bound(sid):
            raise IdentifierTooLongError(too_long("session id", sid))
        return sid

    def for_turn(self, session_id: str, lang: Optional[str] = None,
                 units: Optional[str] = None, site_id: Optional[str] = None) -> Session:
        """The Session to send with the next utterance of `session_id` (created on first use,
        or continued from the store)."""
        sess = SessionManager.sessions.get(session_id)
        if sess is None and self.store is not None:
            sess = self._from_store(session_id)
        if sess is None:
            sess = Session(session_id=session_id)
        caller = self._caller.setdefault(session_id, {})
        site = site_id or self.site_id
        if site:
            caller["site_id"] = sess.site_id = site
        if lang:
            caller["lang"] = sess.lang = lang
        if units:
            caller["system_unit"] = sess.system_unit = units
        register(sess)
        self._used[session_id] = self._clock()
        self._used.move_to_end(session_id)
        return sess

    def seed(self, session_id: str, state: Mapping[str, Any]) -> bool:
        """Start `session_id` from `state` (a Session as `snapshot` gave it, of another
        conversation: a fork), unless it is known here already. False when it was known, or
        `state` is not a Session. Counted like a used session (trimmed like one)."""
        if session_id in SessionManager.sessions or malformed_fields(state):
            return False
        try:
            sess = Session.deserialize({**state, "session_id": session_id})
        except Exception as e:      # not a serialized Session
            LOG.debug(f"not seeding {session_id!r}: {type(e).__name__}")
            return False
        register(sess)
        # the next turn sends the state's conversation as it was written, not re-serialized:
        # this ovos-bus-client rewrites a 4.0 hub's (1.x) context frames so that its skills
        # no longer find their keys in them
        self._from_hub[session_id] = {
            **{k: state[k] for k in CONVERSATION_FIELDS if k in state},
            "session_id": session_id}
        self._used[session_id] = self._clock()
        self._used.move_to_end(session_id)
        return True

    def snapshot(self, session_id: str) -> Optional[Dict[str, Any]]:
        """`session_id`'s Session as it stands: as the hub last sent it (what its next turn
        sends, in the hub's own format), else serialized here; None when it is not known
        here. What `seed` takes."""
        sess = SessionManager.sessions.get(session_id)
        if sess is None:
            return None
        raw = self._from_hub.get(session_id)
        return dict(raw) if raw is not None else sess.serialize()

    def trim(self, keep: Collection[str] = ()) -> int:
        """Forget the least recently used sessions beyond `max_sessions`, and those idle for
        `idle_ttl`, except `keep` (turns in progress, subscriptions). A forgotten session is in
        the store, when one is configured, so a returning conversation continues; without a
        store it starts afresh."""
        now, forgotten, skipped = self._clock(), 0, 0
        while self._used and skipped <= len(keep):
            sid, last = next(iter(self._used.items()))      # the least recently used
            if len(self._used) <= self.max_sessions and now - last < self.idle_ttl:
                break
            if sid in keep:          # in use right now: as good as just used
                self._used.move_to_end(sid)
                skipped += 1
                continue
            self.forget(sid)
            forgotten += 1
        return forgotten

    def forget(self, session_id: str) -> None:
        self.save(session_id)
        SessionManager.sessions.pop(session_id, None)
        self._from_hub.pop(session_id, None)
        self._caller.pop(session_id, None)
        self._used.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._used)

    def wire(self, session: Session) -> Dict[str, Any]:
        """What of `session` goes to the hub: the conversation, what the caller set, and what
        the hub itself told us, but never the client's defaults or the hub's policy fields."""
        sid = session.session_id
        caller = self._caller.get(sid, {})
        raw = self._from_hub.get(sid)
        if raw is not None:
            keep = {k: v for k, v in raw.items() if k not in HUB_FIELDS}
        else:
            full = session.serialize()
            keep = {k: full[k] for k in ("session_id",) + CONVERSATION_FIELDS if k in full}
        keep.update(caller)
        return keep

    def absorb(self, session_id: str, data: Mapping[str, Any],
               response_mode_only: bool = False) -> bool:
        """Store the Session a reply carries, so the next turn sends what the skills changed.

        Only a Session with exactly this id is stored: a reply can never write another
        conversation's state. `response_mode_only` takes just which skills still wait for an
        answer, from a handler that started before the current turn (its other state is older).
        """
        if data.get("session_id") != session_id:
            return False
        wrong = malformed_fields(data)
        if wrong:
            LOG.debug(f"ignoring session in reply with malformed fields: {wrong}")
            return False
        try:
            # ovos-bus-client 1.x (a 4.0 hub's ovos-core) writes unset fields as null, which
            # 2.x reads as omitted after a WARNING per field and message: omit them here
            sess = Session.deserialize({k: v for k, v in data.items() if v is not None})
        except Exception as e:  # hostile or from an incompatible hub version
            LOG.debug(f"ignoring undecodable session in reply: {type(e).__name__}")
            return False
        if sess.session_id != session_id:
            return False
        if response_mode_only:
            current = SessionManager.sessions.get(session_id)
            if current is None:
                return False
            merged = current.serialize()   # ovos-bus-client 2.x derives utterance_states
            for key in RESPONSE_MODE_FIELDS:   # from response_mode: copy both, as sent
                if data.get(key) is not None:
                    merged[key] = data[key]
                else:
                    merged.pop(key, None)
            SessionManager.sessions[session_id] = Session.deserialize(merged)
            raw = self._from_hub.get(session_id)
            if raw is not None:   # a field the hub left out is unset (2.x omits an ended one)
                raw = dict(raw)   # a new dict: the caller's thread may be reading the old one
                for key in RESPONSE_MODE_FIELDS:
                    if key in data:
                        raw[key] = data[key]
                    else:
                        raw.pop(key, None)
                self._from_hub[session_id] = raw
            return True
        SessionManager.sessions[session_id] = sess
        self._from_hub[session_id] = dict(data)
        return True

    def save(self, session_id: str) -> None:
        """Keep the conversation for a later process (when a store is configured)."""
        raw = self._from_hub.get(session_id)
        if self.store is None or raw is None or session_id not in SessionManager.sessions:
            return
        self.store.save(session_id, raw)

    def _from_store(self, session_id: str) -> Optional[Session]:
        if self.store is None:
            return None
        data = self.store.load(session_id)
        if data is None or data.get("session_id") != session_id:
            return None
        if self.absorb(session_id, data):
            return SessionManager.sessions[session_id]
        return None
