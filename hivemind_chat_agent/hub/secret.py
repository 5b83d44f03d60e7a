"""The hub's own secret that engine session ids are keyed with (core/satellites.py), kept in a
file beside hivemind-core's database so ids stay the same across restarts."""
import os
import secrets

SECRET_FILE = ("hivemind-chat-agent", "hub-secret")


def hub_secret(data_home: str) -> bytes:
    """This hub's own random secret, created on first use under its data dir (mode 0600).

    Engine session ids are keyed with it, so nobody outside the hub can compute another
    satellite's id, and they reveal nothing of an access key."""
    path = os.path.join(data_home, *SECRET_FILE)
    try:
        with open(path, "rb") as f:
            secret = f.read()
        if len(secret) >= 32:
            return secret
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    secret = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    return secret
