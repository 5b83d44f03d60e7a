"""Chat with a remote OVOS hub over HiveMind (client ChatEngine) and serve HiveMind satellites
with any chat engine (hub-side agent protocol)."""
from hivemind_chat_agent.client.agent import HiveMindChatAgent
from hivemind_chat_agent.client.chat_turn import ChatTurn
from hivemind_chat_agent.core.outcomes import TurnStatus
from hivemind_chat_agent.hub.protocol import ChatAgentProtocol
from hivemind_chat_agent.errors import (AccessKeyRejectedError, AgentClosedError,
                                        AuthenticationError, ConfigurationError,
                                        ConnectionLostError, HandshakeTimeoutError,
                                        HiveMindChatError, HubBusyError, HubEngineError,
                                        HubUnreachableError,
                                        ReplyTooLargeError, TurnTimeoutError,
                                        WrongPasswordError, UnsupportedHubError,
                                        ClientKeyRefusedError, HubKeyChangedError,
                                        PolicyDeniedError)

__all__ = ["HiveMindChatAgent", "ChatTurn", "TurnStatus", "ChatAgentProtocol", "HiveMindChatError", "ConfigurationError",
           "HubUnreachableError", "AuthenticationError", "AccessKeyRejectedError",
           "WrongPasswordError", "HandshakeTimeoutError", "ConnectionLostError",
           "TurnTimeoutError", "AgentClosedError", "ReplyTooLargeError",
           "HubBusyError", "HubEngineError", "UnsupportedHubError", "ClientKeyRefusedError",
           "HubKeyChangedError", "PolicyDeniedError"]
