"""TLS to the hub, for real on loopback: certificates made here (the `cryptography` package),
genuine hubs serving `wss://` themselves (hivemind-websocket-plugin's `ssl`), and an attacker's
TLS proxy in front of a genuine plain hub that records every byte it decrypts.

A `wss://` hub must prove its certificate before the websocket upgrade, whose URL carries the
access key, is sent: verified against the system CAs by default, against `ca_file` when given
(the name still checked), or pinned at first use per address with `self_signed: true`.
"""
import datetime
import hashlib
import ipaddress
import json
import os
import select
import socket
import ssl
import stat
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hubs import HubProcess, plugin_config

from hivemind_chat_agent.bridges.local_hub import hub_environment
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.errors import (
    ConfigurationError,
    HubCertificateChangedError,
    HubCertificateError,
)

BASE = {"host": "wss://127.0.0.1", "key": "k" * 32, "password": "p" * 16}


# ---- certificates ----
class Issued:
    """A certificate and its key, as PEM files in `directory` named `name`.crt / `name`.key
    (the names hivemind-websocket-plugin's `cert_dir`/`cert_name` read)."""

    def __init__(self, directory, name, cert, key):
        self.cert, self.key = cert, key
        self.cert_path = os.path.join(directory, f"{name}.crt")
        self.key_path = os.path.join(directory, f"{name}.key")
        os.makedirs(directory, exist_ok=True)
        with open(self.cert_path, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(self.key_path, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def issue(directory, name, ips=(), dns=(), issuer=None, ca=False) -> Issued:
    """A certificate for `ips`/`dns`, signed by `issuer` (self-signed without one)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    signer = issuer.key if issuer else key
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer.cert.subject if issuer else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                              critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   signer.public_key()), critical=False))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    names = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips] + \
        [x509.DNSName(d) for d in dns]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return Issued(directory, name, builder.sign(signer, hashes.SHA256()), key)


# ---- an attacker on the path ----
class TLSInterceptor:
    """A TLS server on 127.0.0.1 with a certificate of the test's choosing, forwarding what it
    decrypts to a plain hub (or to nothing): what someone on the path runs. `received` holds
    every byte any client sent it inside TLS, `handshakes` how many TLS handshakes completed."""

    def __init__(self, issued: Issued, forward_to=None, port=0):
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(issued.cert_path, issued.key_path)
        self.forward_to = forward_to
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.received = bytearray()
        self.handshakes = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        conn.settimeout(5)
        try:
            tls = self.context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):     # the client refused our certificate
            conn.close()
            return
        self.handshakes += 1
        upstream = socket.create_connection(("127.0.0.1", self.forward_to)) \
            if self.forward_to else None
        try:
            self._pipe(tls, upstream)
        except (ssl.SSLError, OSError):
            pass
        finally:
            tls.close()
            if upstream is not None:
                upstream.close()

    def _pipe(self, tls, upstream):
        ends = [tls] + ([upstream] if upstream is not None else [])
        while not self._closed:
            readable = select.select(ends, [], [], 0.2)[0]
            if tls.pending() and tls not in readable:
                readable.append(tls)
            for end in readable:
                data = end.recv(65536)
                if not data:
                    return
                if end is tls:
                    self.received += data
                    if upstream is not None:
                        upstream.sendall(data)
                else:
                    tls.sendall(data)

    def close(self):
        self._closed = True
        self.listener.close()


# ---- genuine hubs serving TLS themselves ----
def tls_hub(generation, cert_dir, cert_name="hub") -> HubProcess:
    """A genuine hub (our plugin, tests/engines.py's ScriptEngine) on `wss://`: its websocket
    plugin serves `cert_dir`/`cert_name`.crt, generating a self-signed one if absent."""
    hub = HubProcess(plugin_config(), generation=generation)
    path = os.path.join(hub_environment(hub.home)["XDG_CONFIG_HOME"], "hivemind-core",
                        "server.json")
    with open(path) as f:
        server = json.load(f)
    server["network_protocol"]["hivemind-websocket-plugin"].update(
        ssl=True, cert_dir=str(cert_dir), cert_name=cert_name)
    with open(path, "w") as f:
        json.dump(server, f)
    return hub.start()


def wss(creds, port=None, **extra):
    return {**creds.agent_config(host="wss://127.0.0.1", timeout=15), "port": port or creds.port,
            **extra}


def pins_file(keys_dir) -> str:
    return os.path.join(str(keys_dir), "hub-certificates.json")


# ---- configuration (quick loop) ----
def test_wss_verifies_by_default_and_self_signed_is_opt_in():
    config = ClientConfig.from_dict(BASE)
    assert (config.secure, config.self_signed, config.ca_file) == (True, False, None)
    assert ClientConfig.from_dict({**BASE, "self_signed": "true"}).self_signed is True


def test_ca_file_must_exist_and_not_contradict_self_signed(tmp_path):
    ca = issue(str(tmp_path), "ca", ca=True)
    config = ClientConfig.from_dict({**BASE, "ca_file": ca.cert_path})
    assert config.ca_file == ca.cert_path
    with pytest.raises(ConfigurationError, match="ca_file"):
        ClientConfig.from_dict({**BASE, "ca_file": str(tmp_path / "missing.pem")})
    with pytest.raises(ConfigurationError, match="ca_file"):
        ClientConfig.from_dict({**BASE, "ca_file": ["a", "b"]})
    with pytest.raises(ConfigurationError, match="self_signed"):
        ClientConfig.from_dict({**BASE, "ca_file": ca.cert_path, "self_signed": True})
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(ConfigurationError, match="ca_file"):
        ClientConfig.from_dict({**BASE, "ca_file": str(not_pem)})


# ---- the pin decision and its file (quick loop) ----
def test_the_first_certificate_is_pinned_the_same_accepted_another_refused():
    from hivemind_chat_agent.core.certificate_pins import PinAction, decide_pin
    assert decide_pin("h:1", "aa", None, "/p.json").action is PinAction.PIN
    assert decide_pin("h:1", "aa", "aa", "/p.json").action is PinAction.ACCEPT
    refused = decide_pin("h:1", "bb", "aa", "/p.json")
    assert refused.action is PinAction.REFUSE
    assert isinstance(refused.error, HubCertificateChangedError)
    assert "/p.json" in str(refused.error) and '"h:1"' in str(refused.error)


def test_pins_are_private_per_address_and_survive_a_new_store(tmp_path):
    from hivemind_chat_agent.client.tls_pins import CertificatePins
    pins = CertificatePins(str(tmp_path / "keys"))
    pins.pin("127.0.0.1:5678", "aa" * 32)
    pins.pin("127.0.0.1:5679", "bb" * 32)
    again = CertificatePins(str(tmp_path / "keys"))
    assert again.pinned("127.0.0.1:5678") == "aa" * 32
    assert again.pinned("127.0.0.1:5679") == "bb" * 32
    assert again.pinned("127.0.0.2:5678") is None
    assert stat.S_IMODE(os.stat(pins.path).st_mode) == 0o600
    assert [n for n in os.listdir(tmp_path / "keys") if n.endswith(".new")] == []


def test_an_unreadable_or_shared_pin_file_is_refused_not_forgotten(tmp_path):
    from hivemind_chat_agent.client.tls_pins import CertificatePins
    pins = CertificatePins(str(tmp_path))
    with open(pins.path, "w") as f:
        f.write("{not json")
    with pytest.raises(HubCertificateError, match="hub-certificates.json"):
        pins.pinned("127.0.0.1:5678")      # forgetting the pins would trust anyone again
    os.remove(pins.path)
    pins.pin("127.0.0.1:5678", "aa" * 32)
    os.chmod(pins.path, 0o666)
    with pytest.raises(ConfigurationError, match="other users"):
        pins.pinned("127.0.0.1:5678")


# ---- real TLS against genuine hubs ----
def test_a_certificate_for_another_name_is_refused_before_the_key_is_sent(
        hub, make_agent, tmp_path):
    """The finding: a proxy with a certificate for another name read the access key."""
    creds = hub.add_client()      # its own: a 5.x hub pins the Noise key of tmp_path's keys
    ca = issue(str(tmp_path), "ca", ca=True)
    other_name = issue(str(tmp_path), "other", dns=["hub.example"], issuer=ca)
    proxy = TLSInterceptor(other_name, forward_to=creds.port)
    try:
        agent = make_agent(wss(creds, proxy.port, noise_key_dir=str(tmp_path / "keys")))
        with pytest.raises(HubCertificateError, match="ca_file.*self_signed|self_signed.*ca_file"):
            agent.get_response("hello", session_id="tls")
        # the same CA given as ca_file: the chain verifies, the name still does not
        named = make_agent(wss(creds, proxy.port, ca_file=ca.cert_path,
                               noise_key_dir=str(tmp_path / "keys")))
        with pytest.raises(HubCertificateError, match="127.0.0.1"):
            named.get_response("hello", session_id="tls")
        assert proxy.received == b"" and proxy.handshakes == 0
    finally:
        proxy.close()


def test_ca_file_accepts_the_hub_when_the_name_matches(generation, make_agent, tmp_path):
    ca = issue(str(tmp_path / "ca"), "ca", ca=True)
    hub_cert = issue(str(tmp_path / "hub"), "hub", ips=["127.0.0.1"], issuer=ca)
    hub = tls_hub(generation, tmp_path / "hub")
    try:
        creds = hub.add_client()
        keys = str(tmp_path / "keys")
        unknown_ca = make_agent(wss(creds, noise_key_dir=keys))
        with pytest.raises(HubCertificateError, match="ca_file"):
            unknown_ca.get_response("hello", session_id="tls")
        by_ca = make_agent(wss(creds, ca_file=ca.cert_path, noise_key_dir=keys))
        assert by_ca.get_response("hello", session_id="tls") == "hello there"
        assert by_ca.get_response("count 2", session_id="tls") == "sentence 1\nsentence 2"
        by_own_cert = make_agent(wss(creds, ca_file=hub_cert.cert_path, noise_key_dir=keys))
        assert by_own_cert.get_response("hello", session_id="tls") == "hello there"
        assert not os.path.exists(pins_file(keys))     # nothing pinned: the CA vouches
    finally:
        hub.cleanup()


def test_self_signed_pins_the_hubs_own_certificate_and_refuses_another(
        generation, make_agent, tmp_path):
    """The hub's own generated certificate (no name for 127.0.0.1, no CA) pinned at the first
    connection, accepted by the next agent, and someone else's at the same address refused
    with the pin file named, after the TLS handshake and before the upgrade."""
    cert_dir = tmp_path / "hub"
    hub = tls_hub(generation, cert_dir)       # generates hub.crt itself
    keys = str(tmp_path / "keys")
    try:
        creds = hub.add_client()
        first = make_agent(wss(creds, self_signed=True, noise_key_dir=keys))
        assert first.get_response("hello", session_id="tls") == "hello there"
        with open(cert_dir / "hub.crt", "rb") as f:
            der = ssl.PEM_cert_to_DER_cert(f.read().decode())
        with open(pins_file(keys)) as f:
            assert json.load(f) == {f"127.0.0.1:{hub.port}": hashlib.sha256(der).hexdigest()}
        assert stat.S_IMODE(os.stat(pins_file(keys)).st_mode) == 0o600
        first.shutdown()
        again = make_agent(wss(creds, self_signed=True, noise_key_dir=keys))
        assert again.get_response("count 2", session_id="tls") == "sentence 1\nsentence 2"
        again.shutdown()
    finally:
        hub.stop()
    impostor = TLSInterceptor(issue(str(tmp_path / "impostor"), "hub", ips=["127.0.0.1"]),
                              port=hub.port)
    try:
        agent = make_agent(wss(creds, self_signed=True, noise_key_dir=keys))
        with pytest.raises(HubCertificateChangedError) as refused:
            agent.get_response("hello", session_id="tls")
        assert pins_file(keys) in str(refused.value)
        assert f'"127.0.0.1:{hub.port}"' in str(refused.value)
        assert impostor.received == b""
    finally:
        impostor.close()
        hub.cleanup()


def test_a_pinned_address_is_not_trusted_for_another_port(hub, make_agent, tmp_path):
    """Pins are per host:port: a first connection elsewhere pins there, not here."""
    creds = hub.add_client()
    keys = str(tmp_path / "keys")
    a = TLSInterceptor(issue(str(tmp_path / "a"), "a"), forward_to=creds.port)
    b = TLSInterceptor(issue(str(tmp_path / "b"), "b"), forward_to=creds.port)
    try:
        for proxy in (a, b):
            agent = make_agent(wss(creds, proxy.port, self_signed=True, noise_key_dir=keys))
            assert agent.get_response("hello", session_id="tls") == "hello there"
        with open(pins_file(keys)) as f:
            assert sorted(json.load(f)) == sorted([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"])
    finally:
        a.close()
        b.close()



@pytest.mark.hub
def test_the_cli_pins_with_self_signed_and_verifies_with_ca_file(tmp_path):
    """`hivemind-chat --host wss://…` as a person runs it: refused by default, --self-signed
    pins the hub's own certificate (in $XDG_CONFIG_HOME), --ca-file verifies against it."""
    import subprocess
    import sys
    cli = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")
    hub = tls_hub("5", tmp_path / "hub")
    try:
        creds = hub.add_client()
        env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"),
               "XDG_STATE_HOME": str(tmp_path / "state"), "HIVEMIND_CHAT_PASSWORD": creds.password}
        base = [cli, "--host", "wss://127.0.0.1", "--port", str(hub.port), "--key", creds.key,
                "--no-store"]

        def run(*extra):
            return subprocess.run([*base, *extra, "hello"], env=env, capture_output=True,
                                  text=True, timeout=60)
        refused = run()
        assert refused.returncode == 1 and "--self-signed" in refused.stderr, refused.stderr
        pinned = run("--self-signed")
        assert (pinned.returncode, pinned.stdout.strip()) == (0, "hello there"), pinned.stderr
        keys = tmp_path / "config" / "hivemind" / "hivemind-chat-agent"
        assert f"127.0.0.1:{hub.port}" in json.loads((keys / "hub-certificates.json").read_text())
        by_file = run("--ca-file", str(tmp_path / "hub" / "hub.crt"))
        # hivemind-core's own certificate names its host name, not 127.0.0.1
        assert by_file.returncode == 1 and "mismatch" in by_file.stderr, by_file.stderr
    finally:
        hub.cleanup()
