"""What `hivemind-chat-agent-plugin` reads from hivemind-core's server.json, and its engine."""
import importlib
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from ovos_plugin_manager.templates.agents import ChatEngine

from hivemind_chat_agent.core.loop_share import DEFAULT_BURST, DEFAULT_SHARE, loop_pacing
from hivemind_chat_agent.core.protocol_names import CHAT_PLUGIN_NAME as PLUGIN_NAME
from hivemind_chat_agent.errors import ConfigurationError
from hivemind_chat_agent.hub.operated import Operated, operated_values


@dataclass(frozen=True)
class HubSettings(Operated):
    engine: Any
    engine_config: Dict[str, Any] = field(repr=False)   # may hold a relay's credentials
    timeout: float = 30.0        # rolling: each sentence gives the engine this long again
    workers: int = 8             # engine calls running at once
    max_queue: int = 64          # turns waiting for a worker before new ones are refused
    max_queue_per_session: int = 4   # so one hung session cannot fill the queue for all
    workers_per_client: int = 4  # engine calls of one access key at once (all its sessions)
    max_queue_per_client: int = 16   # turns of one access key waiting
    session_ttl: float = 3600.0  # a satellite session unseen this long is forgotten
    max_sessions_per_client: int = 256   # beyond: the client's least recently seen is forgotten
    max_turn_records_per_client: int = 256   # beyond: its oldest finished record is dropped
    history_turns: int = 10      # earlier exchanges the engine gets with each utterance (0: none)
    history_bytes: int = 32768   # and at most this much of their text, per session
    conversation_store: str = "memory"   # or "redis://HOST:PORT/DB", shared by replicas
    store_durable: bool = False  # an answer's end waits for a Redis replica's ack (WAIT 1)
    health: str = ""             # "HOST:PORT" of /healthz, /readyz, /metrics; "" off
    health_allow_from: Tuple[str, ...] = ()   # networks that may reach a non-loopback health
    drain_timeout: float = 20.0  # on SIGTERM: seconds the running turns get to finish
    # each satellite connection's (share, burst) of the IO loop; None: reads not paced
    loop_pacing: Optional[Tuple[float, float]] = (DEFAULT_SHARE, DEFAULT_BURST)

    @classmethod
    def from_dict(cls, config: Dict[str, Any]) -> "HubSettings":
        engine = config.get("engine")
        if not engine:
            raise ConfigurationError(
                f'"{PLUGIN_NAME}" needs an "engine" (an opm.agents.chat plugin name) in '
                'server.json: "agent_protocol": {"module": "hivemind-chat-agent-plugin", '
                '"hivemind-chat-agent-plugin": {"engine": "...", "engine_config": {...}}}')
        try:
            settings = cls(engine=engine, engine_config=dict(config.get("engine_config") or {}),
                           timeout=float(config.get("timeout", 30)),
                           workers=int(config.get("workers", 8)),
                           max_queue=int(config.get("max_queue", 64)),
                           max_queue_per_session=int(config.get("max_queue_per_session", 4)),
                           workers_per_client=int(config.get(
                               "workers_per_client", max(1, int(config.get("workers", 8)) // 2))),
                           max_queue_per_client=int(config.get("max_queue_per_client", 16)),
                           session_ttl=float(config.get("session_ttl", 3600)),
                           max_sessions_per_client=int(config.get("max_sessions_per_client",
                                                                  256)),
                           max_turn_records_per_client=int(config.get(
                               "max_turn_records_per_client", 256)),
                           history_turns=int(config.get("history_turns", 10)),
                           history_bytes=int(config.get("history_bytes", 32768)),
                           conversation_store=str(config.get("conversation_store") or "memory"),
                           store_durable=_flag(config, "store_durable"),
                           loop_pacing=loop_pacing(config), **operated_values(config))
        except (TypeError, ValueError) as e:
            raise ConfigurationError(f"invalid number in {PLUGIN_NAME} config: {e}") from None
        if settings.timeout <= 0 or settings.workers < 1 or settings.max_queue < 1 \
                or settings.max_queue_per_session < 1 or settings.session_ttl <= 0 \
                or settings.workers_per_client < 1 or settings.max_queue_per_client < 1 \
                or settings.max_sessions_per_client < 1 or settings.history_turns < 0 \
                or settings.max_turn_records_per_client < 1 \
                or settings.history_bytes < 256 or not settings.drain_timeout >= 0:
            raise ConfigurationError(f"{PLUGIN_NAME}: timeout and session_ttl must be > 0, "
                                     "workers, max_queue and the per-session and per-client "
                                     "bounds >= 1, history_turns and drain_timeout >= 0, "
                                     "history_bytes >= 256")
        settings.check_operated()
        return settings


def _flag(config: Dict[str, Any], name: str) -> bool:
    """A true/false setting, absent meaning false. Anything else is refused rather than read
    as truthy: "false" or 0 taken for true (or "yes" for false) would switch a guarantee
    silently."""
    value = config.get(name, False)
    if not isinstance(value, bool):
        raise ConfigurationError(
            f"{PLUGIN_NAME}: {name} must be true or false (a JSON boolean), not {value!r}")
    return value


def load_engine(name: str, config: Dict[str, Any]) -> ChatEngine:
    """An opm.agents.chat plugin by entry-point name, or any ChatEngine as "module:Class"."""
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            engine_class = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigurationError(f"chat engine {name!r} cannot be imported: {e}") from None
    else:
        from ovos_plugin_manager.agents import find_chat_plugins
        plugins = find_chat_plugins()
        engine_class = plugins.get(name)
        if engine_class is None:
            raise ConfigurationError(
                f"chat engine {name!r} is not installed; installed opm.agents.chat plugins: "
                f"{sorted(plugins) or 'none'}. Install it or fix \"engine\" in server.json")
    try:
        return engine_class(config)
    except Exception as e:
        raise ConfigurationError(f"chat engine {name!r} failed to start: "
                                 f"{type(e).__name__}: {e}") from e
