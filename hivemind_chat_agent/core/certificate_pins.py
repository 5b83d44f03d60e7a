"""Whether a `wss://` hub's TLS certificate may be trusted, and the words for when it may not,
without I/O.

Two ways to trust a hub's certificate: it verifies (the system CAs, or `ca_file`, with the host
name checked), or, with `self_signed: true`, it is the one this client pinned for the address at
its first connection (trust on first use, as the hubs' Noise keys are pinned, and as ssh does).
Either decision is taken after the TLS handshake and before the websocket upgrade, whose URL
carries the access key: a refused hub has read nothing but a TLS ClientHello.
"""
import hashlib
from dataclasses import dataclass
from enum import Enum
from typing import Optional

from hivemind_chat_agent.errors import HubCertificateChangedError, HubCertificateError


def fingerprint(der: bytes) -> str:
    """The SHA-256 of a DER certificate, in hex: what a pin holds."""
    return hashlib.sha256(der).hexdigest()


def readable(digest: str) -> str:
    """"ab12…" as "AB:12:…", the form `openssl x509 -noout -fingerprint -sha256` prints, so a
    person can compare it with the certificate on the hub."""
    text = digest.upper()
    return ":".join(text[i:i + 2] for i in range(0, len(text), 2))


class PinAction(Enum):
    ACCEPT = "accept"     # the pinned certificate
    PIN = "pin"           # the first certificate seen at this address: store it, then accept
    REFUSE = "refuse"     # another certificate than the pinned one


@dataclass(frozen=True)
class PinDecision:
    action: PinAction
    error: Optional[HubCertificateChangedError] = None


def decide_pin(address: str, presented: str, pinned: Optional[str],
               pins_path: str) -> PinDecision:
    """What to do with the certificate (`presented`, a fingerprint) a self-signed hub at
    `address` ("host:port") showed, given the one pinned for it (None: never connected)."""
    if not pinned:
        return PinDecision(PinAction.PIN)
    if presented == pinned:
        return PinDecision(PinAction.ACCEPT)
    return PinDecision(PinAction.REFUSE, HubCertificateChangedError(
        f"the hub at {address} presented a TLS certificate (SHA-256 {readable(presented)}) "
        f"other than the one this client pinned there at its first connection (SHA-256 "
        f"{readable(pinned)}): someone on the network may be intercepting the connection, so "
        "the access key was not sent. If the hub's certificate was replaced on purpose (a "
        f"reinstall, a renewal), delete the \"{address}\" line from {pins_path} and connect "
        "again; or give the hub a certificate from a CA and set ca_file"))


def verification_refused(address: str, reason: str, ca_file: Optional[str]) -> HubCertificateError:
    """The error for a certificate that did not verify (unknown CA, another name, expired)."""
    against = f"the CA in ca_file ({ca_file})" if ca_file else "the system's CAs"
    advice = ("check that ca_file holds the CA that signed the hub's certificate (or the "
              "certificate itself) and that the certificate names the host you connect to"
              if ca_file else
              "if the hub uses its own self-signed certificate (hivemind-core generates one), "
              "set self_signed: true (hivemind-chat --self-signed) to pin it at the first "
              "connection, or ca_file (--ca-file) to the hub's certificate or its CA")
    return HubCertificateError(
        f"the TLS certificate of the hub at {address} does not verify against {against} "
        f"({reason}), so the access key was not sent; {advice}. Otherwise someone on the "
        "network may be intercepting the connection")
