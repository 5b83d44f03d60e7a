"""Chat with a remote OVOS hub over HiveMind (client ChatEngine) and serve HiveMind satellites
with any chat engine (hub-side agent protocol).

Importing the package loads nothing but this file: each public name is imported the first time
it is used (module ``__getattr__``), so a client-only program never loads the hub's libraries
(hivemind-core, hivemind-plugin-manager, tornado), and no other library is patched at import.
"""
import importlib
from typing import Any, Dict

# public name -> module that defines it
_EXPORTS: Dict[str, str] = {
    "HiveMindChatAgent": "hivemind_chat_agent.client.agent",
    "ChatTurn": "hivemind_chat_agent.client.chat_turn",
    "Subscription": "hivemind_chat_agent.client.subscriptions",
    "TurnStatus": "hivemind_chat_agent.core.outcomes",
    "ChatAgentProtocol": "hivemind_chat_agent.hub.protocol",
}
_ERRORS = ("HiveMindChatError", "ConfigurationError", "MissingExtraError",
           "HubUnreachableError", "AuthenticationError", "AccessKeyRejectedError",
           "WrongPasswordError", "HandshakeTimeoutError", "ConnectionLostError",
           "TurnTimeoutError", "AgentClosedError", "ReplyTooLargeError", "HubBusyError",
           "HubDrainingError",
           "HubEngineError", "HubBackendUnavailableError", "UnsupportedHubError",
           "ClientKeyRefusedError",
           "HubKeyChangedError", "HubCertificateError", "HubCertificateChangedError",
           "PolicyDeniedError", "IdentifierTooLongError", "HubSilentError",
           "BrokerRefusedError", "AccessKeyInUseError", "HubSessionDroppedError")
_EXPORTS.update((name, "hivemind_chat_agent.errors") for name in _ERRORS)
# the extra whose packages a public name needs beyond the client's
_EXTRA_OF = {"ChatAgentProtocol": "hub"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'hivemind_chat_agent' has no attribute {name!r}")
    if name in _EXTRA_OF:
        from hivemind_chat_agent.extras import require
        require(_EXTRA_OF[name], f"hivemind_chat_agent.{name}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value    # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
