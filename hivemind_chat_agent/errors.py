"""Typed failures of a HiveMind chat turn.

Every message says what happened and what to do about it, because these reach a person (the CLI)
or an operator reading a persona's log. No message ever contains an access key or a password.
"""


class HiveMindChatError(Exception):
    """Base class: anything that kept a turn from getting its answer."""


class ConfigurationError(HiveMindChatError):
    """The agent's configuration is incomplete or contradictory."""


class MissingExtraError(ConfigurationError, ImportError):
    """A command or name needs an optional part of the package (an extra of setup.py) that is
    not installed; the message names the extra and the pip command that adds it."""


class IdentifierTooLongError(ConfigurationError):
    """A session id (or turn id) is over the bound both sides keep (core/limits.MAX_ID_BYTES,
    256 bytes of UTF-8): the client refuses it before sending anything, a hub running our
    plugin refuses the turn with reason "id_too_long" (also for an id that is not UTF-8, a
    lone surrogate). Use a shorter id (a digest of a long name, for instance)."""


class HubUnreachableError(HiveMindChatError):
    """No HiveMind hub answered at the configured address."""


class AuthenticationError(HiveMindChatError):
    """The hub refused this client's credentials."""


class AccessKeyRejectedError(AuthenticationError):
    """The hub closed the connection on the access key, before any handshake."""


class WrongPasswordError(AuthenticationError):
    """The hub's handshake envelope does not match our password."""


class HandshakeTimeoutError(HiveMindChatError):
    """The websocket opened but the encrypted handshake did not finish in time."""


class ConnectionLostError(HiveMindChatError):
    """The connection to the hub dropped while a turn was waiting for its answer."""


class TurnTimeoutError(HiveMindChatError):
    """The hub accepted the utterance but said nothing within the timeout."""


class AgentClosedError(HiveMindChatError):
    """The agent was shut down; it takes no more turns."""


class ReplyTooLargeError(ConnectionLostError):
    """The hub sent a frame over `max_frame_bytes`; the connection was closed unread."""


class HubBusyError(HiveMindChatError):
    """The hub refused the turn: its queue for this client or session is full."""


class HubDrainingError(HubBusyError):
    """The hub is shutting down (a replica draining before a restart) and did not run the turn;
    the client sends such a turn to another replica by itself, and raises this only when every
    attempt found a draining one."""


class HubEngineError(HiveMindChatError):
    """The hub's chat engine failed or went silent on this turn."""


class HubBackendUnavailableError(HubEngineError):
    """The hub (our plugin in OVOS mode) could not reach its local OVOS messagebus, so the
    utterance was not handled; it reconnects by itself: try again in a moment."""


class UnsupportedHubError(HiveMindChatError):
    """The hub speaks a HiveMind protocol version or handshake this install does not."""


class ClientKeyRefusedError(AuthenticationError):
    """A 5.x hub refused this client's Noise static key: it pinned another one for the key."""


class HubKeyChangedError(AuthenticationError):
    """The hub's Noise static key is not the one this client pinned at its first connection."""


class HubCertificateError(AuthenticationError):
    """A `wss://` hub's TLS certificate did not verify (unknown CA, another name), so the
    upgrade request, which carries the access key, was never sent."""


class HubCertificateChangedError(HubCertificateError):
    """A `self_signed` hub presented a TLS certificate other than the one pinned at first use;
    nothing was sent. The message names the pin file and the line to delete if that is expected."""


class PolicyDeniedError(HiveMindChatError):
    """The hub's message policy does not allow this client to send the utterance's topic."""


class ReplyNotSent(HiveMindChatError):
    """The hub plugin could not write a reply to a satellite's connection; the message says
    why (logged by the plugin; the satellite's turn ends by its own timeout or close)."""


class ConversationStoreError(HiveMindChatError):
    """A hub's conversation store (Redis, for replicas) did not answer: the turn was not run.
    Try again once the store is back; the hub reconnects to it by itself."""


class HubSilentError(HubUnreachableError):
    """MQTT: the broker took our HELLO but no hub answered on the key's topics in time. Over
    MQTT a hub that does not know the access key says nothing at all (there is no close code
    to carry a refusal), so the message names everything that can cause it: the key not
    registered on the hub, another topic prefix, the hub not connected to this broker."""


class HubSessionDroppedError(HubUnreachableError):
    """MQTT: the hub dropped this key's session while our handshake was under way (its own
    "offline" for the key, queued through a broker restart, can do that); the connect is made
    again once."""


class BrokerRefusedError(AuthenticationError):
    """MQTT: the broker refused the connection (its username or password, or its ACL)."""


class AccessKeyInUseError(HiveMindChatError):
    """MQTT: a hub keeps one session per access key (its topics are the key's), so a second
    connection on the same key through the same broker would break both; this process has one
    open already. Give each agent (each satellite) an access key of its own."""
