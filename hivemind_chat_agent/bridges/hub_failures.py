"""What a front tells its caller when the hub failed a turn, the same for every front: the
OpenAI API answers it as an error object with its HTTP status, the MCP tool as a tool error,
an A2A task as a failed status. The words name the hub and the failure; the agent's own
message (which may quote addresses, file paths or headers) goes to the server's log only."""
from dataclasses import dataclass

from ovos_utils.log import LOG

from hivemind_chat_agent.errors import (
    AuthenticationError,
    ConnectionLostError,
    HiveMindChatError,
    HubUnreachableError,
    PolicyDeniedError,
    TurnTimeoutError,
)


@dataclass(frozen=True)
class HubFailure:
    """A failed turn as a caller may read it: `message` in plain words, `status` the HTTP
    status that fits (502, 503, 504), `kind` and `code` OpenAI's error type and code."""
    status: int
    message: str
    kind: str
    code: str


def hub_failure(e: HiveMindChatError, hub: str) -> HubFailure:
    """The agent's typed error as what the caller reads, naming `hub` (hub_address) and the
    failure; the agent's full message is logged here, never returned."""
    LOG.warning(f"a turn failed: {type(e).__name__}: {e}")
    if isinstance(e, TurnTimeoutError):
        return HubFailure(504, f"the OVOS hub at {hub} did not answer in time", "timeout",
                          "timeout")
    if isinstance(e, PolicyDeniedError):
        return HubFailure(503, f"the OVOS hub at {hub} refused the utterance (its message "
                               "policy: the server's log says which topic)", "server_error",
                          "hub_refused")
    if isinstance(e, (HubUnreachableError, ConnectionLostError, AuthenticationError)):
        return HubFailure(502, f"the OVOS hub at {hub} is out of reach: {public_reason(e)}; "
                               "the server's log says more", "server_error", "hub_unreachable")
    return HubFailure(502, f"the OVOS hub at {hub} could not answer ({type(e).__name__})",
                      "server_error", "hub_error")


def public_reason(e: HiveMindChatError) -> str:
    """What went wrong, in words that carry no address, path, header or secret."""
    if isinstance(e, AuthenticationError):
        return f"it refused this server's credentials ({type(e).__name__})"
    if isinstance(e, ConnectionLostError):
        return "the connection was lost during the turn"
    return "no HiveMind hub answered there"


def hub_address(agent) -> str:
    """host:port of each hub the agent talks to, for the messages above."""
    cfg = getattr(agent, "settings", None)
    if cfg is None:
        return "the configured address"
    hubs = cfg.hubs or ((cfg.host, cfg.secure, cfg.port),)
    return ", ".join(f"{host}:{port}" for host, _secure, port in hubs)


__all__ = ["HubFailure", "hub_failure", "public_reason", "hub_address"]
