"""What the OVOS mode's routing table (core/ovos_routes.OvosRoutes) takes in and gives out,
as plain values: its bounds, a satellite's message as the shell identified it, a message for
the bus, one for a satellite, and a refusal. The table's neighbours speak these words: the
shell (hub/ovos_mode.py), the settings (hub/ovos_settings.py), and the failure replies
(core/ovos_replies.py) and operations (hub/ovos_operations.py), which need no more of it."""
from dataclasses import dataclass
from typing import Any, Dict

from hivemind_chat_agent.core.turns import EndReason


@dataclass(frozen=True)
class RouteLimits:
    max_queued_per_client: int = 32      # messages of one access key waiting for the bus
    max_in_flight_per_session: int = 4   # utterances of one session OVOS has not handled
    max_in_flight_per_client: int = 16   # ... of one access key, all its sessions
    in_flight_timeout: float = 60.0      # an utterance never handled is forgotten after this
    max_sessions_per_client: int = 256
    session_ttl: float = 3600.0


@dataclass(frozen=True)
class Satellite:
    """An authenticated satellite's message, as the shell identified it."""
    conn: str               # a token of its connection that never changes
    client: str             # its access key's name for fairness and bounds
    peer: str               # hivemind-core's name for the connection when it sent this
    declared_session: str   # the session id the satellite declared
    session_id: str         # the namespaced id OVOS sees (hub/senders.identify)
    handle: Any = None      # the connection object, opaque here: replies are written to it


@dataclass(frozen=True)
class Outbound:
    """A satellite's message for the OVOS bus, and who sent it (for its failure)."""
    message: Dict[str, Any]
    sender: Satellite
    is_utterance: bool


@dataclass(frozen=True)
class Delivery:
    """A bus message for one satellite connection, its session id the satellite's own."""
    handle: Any
    peer: str
    message: Dict[str, Any]


@dataclass(frozen=True)
class Refusal:
    """Why a satellite's message was not queued for the bus."""
    reason: EndReason
    why: str
