"""The key exchange with a hub, chosen from the hub's first HANDSHAKE, behind one interface.

A hivemind-core 4.x hub offers the password handshake (both sides prove the password with an
envelope and derive an AES-GCM or ChaCha20 key; `handshake_password`). A 5.x hub offers only
protocol v3, the Noise XXpsk2 handshake (`handshake_noise`). The connection drives either
through `KeyExchange`; once it completes, a `SecureChannel` seals what we send and opens what
the hub sends (their contracts: core/exchange.py). Nothing here does I/O, so every step is
testable without a socket.
"""
from typing import Any, Dict

from hivemind_chat_agent.core.exchange import ExchangeInputs, KeyExchange
from hivemind_chat_agent.core.handshake_password import PasswordExchange
from hivemind_chat_agent.errors import AuthenticationError, HubKeyChangedError, UnsupportedHubError


def offers_noise(offer: Dict[str, Any]) -> bool:
    """A protocol v3 offer (hivemind-core 5.x): the Noise parameters and version 3."""
    try:
        version = int(offer.get("max_protocol_version") or 0)
    except (TypeError, ValueError):
        version = 0
    return version >= 3 and isinstance(offer.get("noise"), dict)


def choose(hello: Dict[str, Any], offer: Dict[str, Any], inputs: ExchangeInputs) -> KeyExchange:
    """The exchange this hub speaks, from its cleartext HELLO and HANDSHAKE offer. Noise wins
    where a hub offers both, as in hivemind-bus-client: it is the one that pins keys."""
    if offers_noise(offer):
        try:    # imported here: a venv of a stock 4.0 hub has no Noise module
            from hivemind_chat_agent.core.handshake_noise import NoiseExchange
        except ImportError:   # hivemind-bus-client < 0.10.1a1 or poorman-handshake < 2
            raise UnsupportedHubError(
                "the hub speaks only HiveMind protocol v3 (the Noise handshake of "
                "hivemind-core 5.x) and this install has no Noise support; install "
                "hivemind-bus-client>=1.2.12a1 and poorman-handshake>=2.0.0a1") from None
        return NoiseExchange(hello, offer, inputs)
    keys = inputs.noise_keys
    if keys is not None and keys.pinned(inputs.hub_address):
        # a hub that spoke Noise to us offers only the password handshake, whose envelope is a
        # fast hash of the password: refused before it is sent (an attacker on the path strips
        # the Noise offer to crack the password offline)
        raise HubKeyChangedError(
            f"the hub at {inputs.hub_address} spoke the Noise handshake before and now offers "
            "only the password handshake: someone on the network may be downgrading the "
            "connection, so no password proof was sent. If the hub really went back to "
            f"hivemind-core 4.x, remove its line from {keys.pins_path}")
    if offer.get("password"):
        return PasswordExchange(offer, inputs)
    raise AuthenticationError(
        "the hub has no password for this client, so no key can be derived; register it "
        "with `hivemind-core add-client --password ...`")
