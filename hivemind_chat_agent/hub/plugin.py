"""The `hivemind-chat-agent-plugin` entry point: the plugin's mode, read from its server.json
section, picks the agent protocol hivemind-core gets.

    "mode": "chat"  (the default)  a chat engine answers (hub/protocol.ChatAgentProtocol)
    "mode": "ovos"                 the local ovos-core answers, as with the stock
                                   hivemind-ovos-agent-plugin (hub/ovos_mode.OVOSModeProtocol)

Each mode's module is imported only when chosen: the OVOS mode runs beside a stable OVOS
install, whose ovos-plugin-manager has no chat engine template for the chat mode to import.
hivemind-core calls this as it would a plugin class (`agent_protocol(config=...)`).
"""
from typing import Any, Dict, Optional

from hivemind_chat_agent.hub.ovos_settings import mode_of


def agent_protocol(config: Optional[Dict[str, Any]] = None, **kwargs: Any):
    """The agent protocol for `config` (this plugin's server.json section); ConfigurationError
    for an unknown mode or a bad setting, saying what to write."""
    config = dict(config or {})
    if mode_of(config) == "ovos":
        from hivemind_chat_agent.hub.ovos_mode import OVOSModeProtocol
        return OVOSModeProtocol(config=config, **kwargs)
    from hivemind_chat_agent.hub.protocol import ChatAgentProtocol
    return ChatAgentProtocol(config=config, **kwargs)
