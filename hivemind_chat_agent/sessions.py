"""Session bookkeeping: which OVOS Session a turn sends, and what a reply teaches us about it.

The Session of each conversation lives in ovos-bus-client's process-wide `SessionManager`, as the
OVOS chat agents and hivemind agents expect (reference 003); this class only decides how a
caller's session_id maps to it and validates what comes back before it is stored.
"""
from typing import Any, Mapping, Optional

from ovos_bus_client.session import Session, SessionManager
from ovos_utils.log import LOG


# Shapes of the serialized Session fields the pipeline reads; a reply that breaks them is not
# stored (Session.deserialize would take it and fail later, in some skill, on the next turn).
_FIELD_TYPES = {
    "active_skills": list, "utterance_states": dict, "context": dict, "lang": str,
    "site_id": str, "pipeline": list, "blacklisted_skills": list,
    "blacklisted_intents": list, "persona_id": str, "system_unit": str,
    "location": dict, "is_speaking": bool, "is_recording": bool,
}


class SessionBook:
    def __init__(self, default_session_id: str, site_id: Optional[str] = None):
        # "default" is ovos-core's own in-process session, and a 4.0 hub drops non-admin clients
        # that use it; a caller's "default" conversation gets this stable id instead.
        self.default_session_id = default_session_id
        self.site_id = site_id

    def resolve(self, session_id: Optional[str]) -> str:
        if not session_id or session_id == "default":
            return self.default_session_id
        return str(session_id)

    def for_turn(self, session_id: str, lang: Optional[str] = None,
                 units: Optional[str] = None) -> Session:
        """The Session to send with the next utterance of `session_id` (created on first use)."""
        sess = SessionManager.sessions.get(session_id)
        if sess is None:
            sess = Session(session_id=session_id)
            if self.site_id:
                sess.site_id = self.site_id
        if lang:
            sess.lang = lang
        if units:
            sess.system_unit = units
        SessionManager.update(sess)
        return sess

    @staticmethod
    def absorb(session_id: str, data: Mapping[str, Any]) -> bool:
        """Store the Session a reply carries, so the next turn sends what the skills changed.

        Only a Session with exactly this id is stored: a reply can never write another
        conversation's state.
        """
        if data.get("session_id") != session_id:
            return False
        wrong = [k for k, kinds in _FIELD_TYPES.items()
                 if data.get(k) is not None and not isinstance(data[k], kinds)]
        if wrong:
            LOG.debug(f"ignoring session in reply with malformed fields: {wrong}")
            return False
        try:
            sess = Session.deserialize(dict(data))
        except Exception as e:  # hostile or from an incompatible hub version
            LOG.debug(f"ignoring undecodable session in reply: {type(e).__name__}")
            return False
        if sess.session_id != session_id:
            return False
        SessionManager.sessions[session_id] = sess
        return True
