"""The settings by which an operator watches and stops `hivemind-chat-agent-plugin`, the same in
its chat and OVOS modes: the health endpoint and the drain on SIGTERM (docs/metrics.md).

Apart from hub/settings.py so that the OVOS mode, which must load beside a stable OVOS whose
ovos-plugin-manager has no chat engine template, reads them without importing that module.
"""
from typing import Any, Callable, Dict, Tuple

from hivemind_chat_agent.core.health import parse_address
from hivemind_chat_agent.core.peer_gate import AllowList, is_loopback_bind, parse_network
from hivemind_chat_agent.core.protocol_names import CHAT_PLUGIN_NAME as PLUGIN_NAME
from hivemind_chat_agent.errors import ConfigurationError


class Operated:
    """The settings by which an operator watches and stops the plugin, in either mode:
    `health` ("HOST:PORT" of /healthz, /readyz, /metrics; "" off), `health_allow_from` and
    `drain_timeout` (read by `operated_values`)."""
    health: str
    health_allow_from: Tuple[str, ...]
    drain_timeout: float

    def check_operated(self) -> None:
        """ConfigurationError now, at hub start-up, for a drain_timeout below 0 or a health
        endpoint that would not be closed."""
        if not self.drain_timeout >= 0:
            raise ConfigurationError(f"{PLUGIN_NAME}: drain_timeout must be >= 0")
        if self.health:
            self.health_allow()

    def health_address(self) -> Tuple[str, int]:
        """(host, port) of `health`; ConfigurationError saying what to write."""
        try:
            return parse_address(self.health)
        except ValueError as e:
            raise ConfigurationError(f"{PLUGIN_NAME}: {e}") from None

    def serve_health(self, ready: Callable[[], Any], metrics: Any) -> Any:
        """The health endpoint (hub/health_server.HealthServer) started on its own thread at
        `health`, answering `/readyz` with `ready()` and `/metrics` with `metrics` (a
        hub/metrics.HubMetrics); ConfigurationError when the address cannot be listened on."""
        from hivemind_chat_agent.hub.health_server import HealthServer
        host, port = self.health_address()
        try:
            server = HealthServer(host, port, ready, metrics.exposition, self.health_allow())
        except OSError as e:
            raise ConfigurationError(f'{PLUGIN_NAME}: "health": "{self.health}" cannot be '
                                     f"listened on: {e}") from None
        return server.start()

    def health_allow(self) -> AllowList:
        """Who may reach the health endpoint: loopback peers on a loopback bind; beyond
        loopback only the networks `health_allow_from` names (every front is closed by
        default, docs/security.md), else a ConfigurationError that says so."""
        host, _ = self.health_address()
        networks = [parse_network(a, "health_allow_from") for a in self.health_allow_from]
        if not networks and not is_loopback_bind(host):
            raise ConfigurationError(
                f'{PLUGIN_NAME}: "health": "{self.health}" listens beyond loopback, where anyone '
                'who reaches the port would read the hub\'s metrics. Name who may connect '
                '(the load balancer, the Prometheus server) with "health_allow_from": '
                '["10.0.0.5", "10.0.1.0/24"], or listen on 127.0.0.1')
        return AllowList(networks)


def operated_values(config: Dict[str, Any]) -> Dict[str, Any]:
    """`Operated`'s fields from the plugin's config (ValueError/TypeError on a bad number)."""
    return {"health": str(config.get("health") or ""),
            "health_allow_from": strings_of(config.get("health_allow_from")),
            "drain_timeout": float(config.get("drain_timeout", 20))}


def strings_of(value: Any) -> Tuple[str, ...]:
    """A list of strings from the config; one string alone is a list of one."""
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value or ())
