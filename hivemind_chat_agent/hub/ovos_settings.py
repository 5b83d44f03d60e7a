"""What `hivemind-chat-agent-plugin` reads from server.json in OVOS mode (`"mode": "ovos"`).

Kept apart from hub/settings.py on purpose: that module loads the chat engine template of
ovos-plugin-manager pre-releases, which a stable OVOS install (ovos-core 2.1.1 ships
ovos-plugin-manager 2.2.0) does not have; the OVOS mode must load there.
"""
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple
from urllib.parse import urlsplit

from hivemind_chat_agent.core.loop_share import DEFAULT_BURST, DEFAULT_SHARE, loop_pacing
from hivemind_chat_agent.core.ovos_probation import PROBATION_SECONDS, PROBATION_SHARE, Probation
from hivemind_chat_agent.core.ovos_route_terms import RouteLimits
from hivemind_chat_agent.core.protocol_names import CHAT_PLUGIN_NAME as PLUGIN_NAME
from hivemind_chat_agent.errors import ConfigurationError
from hivemind_chat_agent.hub.operated import Operated, operated_values

MODES = ("chat", "ovos")
DEFAULT_BUS = "ws://127.0.0.1:8181/core"
EXAMPLE = (f'"agent_protocol": {{"module": "{PLUGIN_NAME}", "{PLUGIN_NAME}": '
           f'{{"mode": "ovos", "bus": "{DEFAULT_BUS}"}}}}')


def mode_of(config: Dict[str, Any]) -> str:
    """"chat" (a ChatEngine answers) or "ovos" (the local ovos-core answers)."""
    mode = config.get("mode", "chat")
    if mode not in MODES:
        raise ConfigurationError(
            f'{PLUGIN_NAME}: "mode" must be "chat" (a chat engine answers: "engine": "...") '
            f'or "ovos" (the local ovos-core answers: {EXAMPLE}), not {mode!r}')
    return mode


def bus_url(value: Any) -> str:
    """The OVOS messagebus URL, checked: ws:// or wss://, a host, a port if any."""
    url = DEFAULT_BUS if value is None else value
    problem = ""
    if not isinstance(url, str):
        problem = f"a string, not {type(url).__name__}"
    else:
        parts = urlsplit(url)
        try:
            _ = parts.port
        except ValueError:
            problem = "a valid port"
        if not problem and (parts.scheme not in ("ws", "wss") or not parts.hostname):
            problem = "a ws:// or wss:// URL with a host"
    if problem:
        raise ConfigurationError(
            f'{PLUGIN_NAME}: "bus" must be {problem}, the local ovos-core messagebus as '
            f'mycroft.conf\'s "websocket" section names it (host, port, route), e.g. '
            f'{EXAMPLE}; got {str(value)[:100]!r}')
    return url


def wait_for_skills(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f'{PLUGIN_NAME}: "wait_for_skills" must be true (utterances '
                                 "are taken once ovos-core's skills answer on the bus) or "
                                 f"false (at once), not {str(value)[:40]!r}")
    return value


def probation_terms(config: Dict[str, Any]) -> Tuple[float, float]:
    """(`probation_seconds`, `probation_share`), or a ValueError saying what to write."""
    terms = (float(config.get("probation_seconds", PROBATION_SECONDS)),
             float(config.get("probation_share", PROBATION_SHARE)))
    try:
        Probation(*terms)
    except ValueError:
        raise ValueError("probation_seconds must be >= 0 (0: no probation) and "
                         "probation_share a fraction of the time, 0 < share <= 1") from None
    return terms


@dataclass(frozen=True)
class OvosModeSettings(Operated):
    bus: str = DEFAULT_BUS
    limits: RouteLimits = RouteLimits()
    bus_retry: float = 0.5        # first reconnect delay after the bus closed
    bus_max_retry: float = 5.0    # the delay doubles up to this
    connect_wait: float = 5.0     # how long start-up waits for the bus (then goes on)
    query_timeout: float = 10.0   # a QUERY's answer ends this long after its last sentence
    max_queries: int = 8          # QUERY answers in progress at once (more are declined)
    max_query_chars: int = 4096   # a longer QUERY utterance is declined
    wait_for_skills: bool = True  # utterances only once ovos-core's skills answer (is_ready)
    # each satellite connection's (share, burst) of the IO loop; None: reads not paced
    loop_pacing: Optional[Tuple[float, float]] = (DEFAULT_SHARE, DEFAULT_BURST)
    health: str = ""             # "HOST:PORT" of /healthz, /readyz, /metrics; "" off
    health_allow_from: Tuple[str, ...] = ()   # networks that may reach a non-loopback health
    drain_timeout: float = 20.0  # on SIGTERM: seconds the utterances at OVOS get to finish
    # (seconds, share) of a connection's probation after a bound refused it (core/
    # ovos_probation.py); seconds 0: none
    probation: Tuple[float, float] = (PROBATION_SECONDS, PROBATION_SHARE)

    @classmethod
    def from_dict(cls, config: Dict[str, Any]) -> "OvosModeSettings":
        url = bus_url(config.get("bus"))
        defaults = RouteLimits()
        try:
            limits = RouteLimits(
                max_queued_per_client=int(config.get("max_queue_per_client",
                                                     defaults.max_queued_per_client)),
                max_in_flight_per_session=int(config.get(
                    "max_in_flight_per_session", defaults.max_in_flight_per_session)),
                max_in_flight_per_client=int(config.get(
                    "max_in_flight_per_client", defaults.max_in_flight_per_client)),
                in_flight_timeout=float(config.get("in_flight_timeout",
                                                   defaults.in_flight_timeout)),
                max_sessions_per_client=int(config.get("max_sessions_per_client",
                                                       defaults.max_sessions_per_client)),
                session_ttl=float(config.get("session_ttl", defaults.session_ttl)))
            settings = cls(url, limits, float(config.get("bus_retry", 0.5)),
                           float(config.get("bus_max_retry", 5.0)),
                           float(config.get("connect_wait", 5.0)),
                           float(config.get("query_timeout", 10.0)),
                           int(config.get("max_queries", 8)),
                           int(config.get("max_query_chars", 4096)),
                           wait_for_skills(config.get("wait_for_skills", True)),
                           loop_pacing(config), **operated_values(config),
                           probation=probation_terms(config))
        except (TypeError, ValueError) as e:
            raise ConfigurationError(f"invalid number in {PLUGIN_NAME} config: {e}") from None
        if min(limits.max_queued_per_client, limits.max_in_flight_per_session,
               limits.max_in_flight_per_client, limits.max_sessions_per_client) < 1 \
                or limits.in_flight_timeout <= 0 or limits.session_ttl <= 0 \
                or settings.bus_retry <= 0 or settings.bus_max_retry < settings.bus_retry \
                or settings.connect_wait < 0 or settings.query_timeout <= 0 \
                or min(settings.max_queries, settings.max_query_chars) < 1:
            raise ConfigurationError(
                f"{PLUGIN_NAME} (OVOS mode): the queue, in-flight and session bounds must be "
                ">= 1, in_flight_timeout, session_ttl and bus_retry > 0, bus_max_retry >= "
                "bus_retry, connect_wait >= 0, query_timeout > 0, max_queries and "
                "max_query_chars >= 1")
        settings.check_operated()
        return settings
