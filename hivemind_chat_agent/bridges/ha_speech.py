"""The hub's speech between turns as Home Assistant events, without Home Assistant.

An alarm going off, a reminder, a skill that speaks later: the hub says it to the OVOS session
of a conversation when no turn of it is running. `SpeechWatch` keeps one subscription
(HiveMindChatAgent.subscribe) per session a config entry's conversation entity or its
`hivemind_chat.ask` action has used, and hands each
sentence to `fire` as the data of one `hivemind_chat_speech` event (`speech_event`): the
entity, the HA conversation and device the session last served, its language, the text.

Bounded: at most `limit` sessions are watched; a turn on another one releases the one used
longest ago (on a 4.x hub each watched session keeps a connection of its own open). A session
is released when HA forgets its conversation (`release`; the entity does not for a device's
session, which outlives HA's conversations, nor the ask action for its sessions, which HA keeps
no conversation of), and `close` releases them all (the entity is
removed, the entry unloaded). Every method but `remember` may block on the hub
(subscribing opens the session's connection): call them off HA's event loop.
"""
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Mapping, Optional

from hivemind_chat_agent.errors import HiveMindChatError

EVENT_SPEECH = "hivemind_chat_speech"
MAX_WATCHED = 16     # sessions of one entry watched at once
Fire = Callable[[Dict[str, Any]], None]


def speech_context(entry_id: str, entity_id: Optional[str], conversation_id: str,
                   session_id: str, language: str, device_id: Optional[str] = None,
                   satellite_id: Optional[str] = None) -> Dict[str, Any]:
    """A session's context as its events carry it (the conversation entity's turns and the
    ask action's alike): one place names the fields an automation triggers on."""
    return {"config_entry_id": entry_id, "entity_id": entity_id,
            "conversation_id": conversation_id, "session_id": session_id,
            "device_id": device_id, "satellite_id": satellite_id, "language": language}


def speech_event(context: Mapping[str, Any], text: str) -> Dict[str, Any]:
    """The data of one `hivemind_chat_speech` event: the session's `context` (config_entry_id,
    entity_id, conversation_id, session_id, device_id, satellite_id, language: what its last
    turn was) and the sentence `text`."""
    return {**context, "text": text}


class SpeechWatch:
    """The sessions of one config entry whose speech between turns becomes events.

    `agent` is the entry's HiveMindChatAgent; `fire(data)` is called on a subscription's own
    thread with each event's data (HA's thread-safe `hass.bus.fire` fits). Never raises the
    agent's typed errors: a session that cannot be subscribed now (the hub is down) is tried
    again at its next turn."""

    def __init__(self, agent: Any, fire: Fire, limit: int = MAX_WATCHED):
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._agent, self._fire, self._limit = agent, fire, limit
        self._lock = threading.Lock()
        self._subs: "OrderedDict[str, Any]" = OrderedDict()   # session id -> Subscription
        self._contexts: Dict[str, Dict[str, Any]] = {}
        self._closed = False

    def remember(self, session_id: str, context: Mapping[str, Any]) -> bool:
        """Note what a turn of `session_id` was (its `context`, as speech_event takes it) and
        mark it used now. True when the session is already watched; False: call `watch`.
        Never blocks (HA's event loop may call it)."""
        with self._lock:
            self._contexts[session_id] = dict(context)
            if session_id in self._subs:
                self._subs.move_to_end(session_id)
                return True
            return False

    def watch(self, session_id: str) -> bool:
        """Subscribe to `session_id` (after `remember`), releasing the session used longest
        ago past the bound. True when it is watched now; False when the watch is closed or
        the hub could not be reached (a typed error, tried again at the next turn)."""
        with self._lock:
            if self._closed or session_id in self._subs:
                return not self._closed
        try:
            sub = self._agent.subscribe(session_id, callback=self._heard(session_id))
        except HiveMindChatError:
            with self._lock:        # its next turn remembers it again
                if session_id not in self._subs:
                    self._contexts.pop(session_id, None)
            return False
        with self._lock:
            closed = self._closed
            keep = not closed and session_id not in self._subs
            if keep:
                self._subs[session_id] = sub
            unwanted = self._evict() if keep else [sub]   # else: closed, or a twin's
        for old in unwanted:
            old.close()
        return not closed

    def release(self, session_id: str) -> None:
        """Stop watching `session_id` (HA forgot its conversation)."""
        with self._lock:
            sub = self._subs.pop(session_id, None)
            self._contexts.pop(session_id, None)
        if sub is not None:
            sub.close()

    def close(self) -> None:
        """Release every session; later `watch` calls subscribe nothing."""
        with self._lock:
            self._closed = True
            subs = list(self._subs.values())
            self._subs.clear()
            self._contexts.clear()
        for sub in subs:
            sub.close()

    def watched(self) -> List[str]:
        """The watched session ids, the one used longest ago first."""
        with self._lock:
            return list(self._subs)

    def _evict(self) -> List[Any]:
        """(Holding the lock.) The subscriptions past the bound, oldest first, taken out."""
        evicted = []
        while len(self._subs) > self._limit:
            session_id, sub = self._subs.popitem(last=False)
            self._contexts.pop(session_id, None)
            evicted.append(sub)
        return evicted

    def _heard(self, session_id: str) -> Callable[[str], None]:
        def heard(text: str) -> None:
            with self._lock:
                context: Optional[Dict[str, Any]] = self._contexts.get(session_id)
            if context is not None:
                self._fire(speech_event(context, text))
        return heard


__all__ = ["EVENT_SPEECH", "MAX_WATCHED", "speech_event", "SpeechWatch"]
