"""TLS to a `wss://` hub: the context for the configured trust, the handshake, and the hubs'
pinned certificates.

By default a hub's certificate must verify against the system CAs and name the host connected
to; with `ca_file`, against that file instead (a CA bundle, or the hub's own certificate), the
name still checked. With `self_signed: true` the certificate is pinned per address ("host:port")
at the first connection and only that one accepted later, in `hub-certificates.json` beside the
Noise keys (`noise_key_dir`): one file for every access key, because the certificate belongs to
the hub, so a new access key does not trust a new certificate. The decision is taken before the
socket is handed to websocket-client, so a refused hub never gets the upgrade request, whose URL
carries the access key.
"""
import fcntl
import json
import os
import re
import socket
import ssl
import tempfile
import threading
from functools import lru_cache
from typing import Dict, Optional, Tuple

from ovos_utils.log import LOG

from hivemind_chat_agent.core.certificate_pins import (
    PinAction,
    decide_pin,
    fingerprint,
    readable,
    verification_refused,
)
from hivemind_chat_agent.errors import ConfigurationError, HubCertificateError

TLS_HANDSHAKE_TIMEOUT = 2.0   # seconds; a TLS hub on a LAN answers in milliseconds
PINS_FILE = "hub-certificates.json"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_WRITE_LOCK = threading.Lock()


class TLSFailed(Exception):
    """The TLS handshake itself failed (nothing speaks TLS there, or it broke off): no verdict
    on a certificate was reached."""


class CertificatePins:
    """The hubs' pinned certificates, `{"host:port": sha256 hex}`, in one JSON file, mode 0600,
    replaced atomically; a file others can write is refused (they could pin their own)."""

    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self.path = os.path.join(self.directory, PINS_FILE)

    def pinned(self, address: str) -> Optional[str]:
        return self._read().get(address)

    def pin(self, address: str, digest: str) -> str:
        """Pin `digest` for `address` unless a certificate is pinned there already, and return
        the pinned one: when two connections (or processes) pin at once, the first wins and the
        other compares against it."""
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            with _WRITE_LOCK, open(self.path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)    # other processes pinning the same file
                pins = self._read()
                if pins.get(address):
                    return pins[address]
                pins[address] = digest
                fd, scratch = tempfile.mkstemp(dir=self.directory, suffix=".new")  # 0600
                try:
                    with os.fdopen(fd, "w") as f:
                        json.dump(pins, f, indent=1, sort_keys=True)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(scratch, self.path)
                finally:
                    if os.path.exists(scratch):
                        os.unlink(scratch)
        except OSError as e:
            raise HubCertificateError(
                f"could not pin the TLS certificate of the hub at {address} in {self.path} "
                f"({type(e).__name__}), so nothing was sent; make noise_key_dir a writable "
                "directory of this user's") from None
        return digest

    def _read(self) -> Dict[str, str]:
        for path in (self.directory, self.path):
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                continue
            if mode & 0o022:
                raise ConfigurationError(
                    f"{path} is writable by other users, who could pin a certificate of their "
                    "own for a hub; chmod go-w it, or set noise_key_dir to a private directory")
        try:
            with open(self.path) as f:
                pins = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise _unreadable(self.path, type(e).__name__) from None
        if not isinstance(pins, dict) or not all(
                isinstance(v, str) and _DIGEST.match(v) for v in pins.values()):
            raise _unreadable(self.path, "not a map of addresses to SHA-256 digests")
        return {str(k): v for k, v in pins.items()}


def _unreadable(path: str, why: str) -> HubCertificateError:
    return HubCertificateError(
        f"could not read the pinned hub certificates in {path} ({why}), so no self_signed hub "
        "is trusted; fix the file, or delete it to pin each hub's certificate again at its next "
        "connection")


def check_ca_file(path: str) -> None:
    """ConfigurationError unless `path` is a readable PEM file of certificates."""
    _context(path, _stamp(path), False)


def tls_context(cfg) -> ssl.SSLContext:
    """The client context for `cfg`'s trust, built once per CA file version."""
    return _context(cfg.ca_file, _stamp(cfg.ca_file), bool(cfg.self_signed))


def _stamp(path: Optional[str]) -> Tuple[int, int]:
    if not path:
        return (0, 0)
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigurationError(
            f"ca_file {path} cannot be read ({type(e).__name__}); give the path of a PEM file "
            "with the hub's CA or certificate") from None
    return (st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _context(ca_file: Optional[str], version: Tuple[int, int], pinning: bool) -> ssl.SSLContext:
    """`version` (the file's mtime and size) is only part of the cache key: a replaced CA file
    is read again."""
    if pinning:   # the pin vouches, not a CA: checked in open_tls before anything is sent
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        try:
            context = ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigurationError(
                f"ca_file {ca_file} holds no usable certificate ({type(e).__name__}); give a "
                "PEM file with the hub's CA or the hub's own certificate") from None
        if ca_file:   # the hub's own certificate (not a CA) may be the anchor
            context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def open_tls(raw: socket.socket, cfg) -> ssl.SSLSocket:
    """TLS over the connected socket, its certificate verified or matched against the pin;
    HubCertificateError (nothing sent) if it is not to be trusted, TLSFailed if no TLS
    handshake happened. A plain-text hub never answers a ClientHello (its HTTP parser waits for
    the end of a request line), so the handshake gets a short bound of its own."""
    address = f"{cfg.host}:{cfg.port}"
    context = tls_context(cfg)
    raw.settimeout(min(cfg.connect_timeout, TLS_HANDSHAKE_TIMEOUT))
    try:
        tls = context.wrap_socket(raw, server_hostname=cfg.host)
    except ssl.SSLCertVerificationError as e:
        raise verification_refused(address, e.verify_message or e.reason or "unverified",
                                   cfg.ca_file) from None
    except (ssl.SSLError, socket.timeout, OSError) as e:
        raise TLSFailed(f"the TLS handshake with {address} failed ({type(e).__name__}): is the "
                        "hub serving TLS? Use ws:// for a plain hub, wss:// only for one with "
                        "a certificate") from None
    if cfg.self_signed:
        try:
            _check_pin(tls, cfg.noise_key_dir, address)
        except BaseException:
            tls.close()
            raise
    return tls


def _check_pin(tls: ssl.SSLSocket, key_dir: str, address: str) -> None:
    der = tls.getpeercert(binary_form=True)
    if not der:
        raise HubCertificateError(f"the hub at {address} presented no TLS certificate, so "
                                  "nothing was sent")
    pins, presented = CertificatePins(key_dir), fingerprint(der)
    decision = decide_pin(address, presented, pins.pinned(address), pins.path)
    if decision.action is PinAction.PIN:
        decision = decide_pin(address, presented, pins.pin(address, presented), pins.path)
        if decision.action is PinAction.ACCEPT:
            LOG.info(f"pinned the TLS certificate of the hub at {address} (SHA-256 "
                     f"{readable(presented)}) in {pins.path}")
    if decision.action is PinAction.REFUSE:
        raise decision.error or HubCertificateError(
            f"the TLS certificate of the hub at {address} was refused, so nothing was sent")
