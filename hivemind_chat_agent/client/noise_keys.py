"""Where this client's Noise static key and the hubs' pinned keys live.

A hivemind-core 5.x hub pins the first static key it sees for each access key and refuses any
other (1008 "contradicts the pinned key"), so the key must survive reconnects and restarts and
be the same in every process that uses the access key. It is kept beside the HiveMind client
identity (`$XDG_CONFIG_HOME/hivemind/`), one file per access key, named by a digest of the key
(never the key itself), readable by its owner only. The hubs' keys are pinned beside it, by
address, on first use.
"""
import fcntl
import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from typing import Dict, Optional

from hivemind_chat_agent.errors import ConfigurationError

_CREATE_LOCK = threading.Lock()


def default_key_dir() -> str:
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(config_home, "hivemind", "hivemind-chat-agent")


class NoiseKeyring:
    def __init__(self, directory: str, access_key: str):
        digest = hashlib.sha256(f"hivemind-chat-agent:{access_key}".encode()).hexdigest()[:16]
        self.directory = os.path.abspath(directory)
        self.path = os.path.join(self.directory, f"{digest}.noise.key")
        self.pins_path = os.path.join(self.directory, f"{digest}.hub-keys.json")
        self._lock = threading.Lock()

    def ensure(self) -> str:
        """The static key's path, the key created first if it does not exist yet: once, even
        when many connections (or processes) of one access key connect at the same moment, or
        parallel first handshakes would present different keys and all but one be refused."""
        self._check_private()
        if os.path.isfile(self.path):
            return self.path
        with _CREATE_LOCK:
            if os.path.isfile(self.path):
                return self.path
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            from poorman_handshake.noise import NoiseHandShake
            fd, scratch = tempfile.mkstemp(dir=self.directory, suffix=".new")
            os.close(fd)
            os.unlink(scratch)
            try:   # poorman-handshake generates and writes the key (mode 0600) ...
                NoiseHandShake(initiator=True, path=scratch, psk=bytes(32))
                try:   # ... and the link is atomic: a racing process keeps the first key
                    os.link(scratch, self.path)
                except FileExistsError:
                    pass
            finally:
                if os.path.exists(scratch):
                    os.unlink(scratch)
        return self.path

    def pinned(self, address: str) -> Optional[str]:
        return self._pins().get(address)

    def pin(self, address: str, pubkey: str) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        with self._lock, open(self.pins_path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)    # other processes pinning the same file
            pins = self._pins()
            if pins.get(address) == pubkey:
                return
            pins[address] = pubkey
            fd, scratch = tempfile.mkstemp(dir=self.directory, suffix=".new")
            with os.fdopen(fd, "w") as f:
                json.dump(pins, f, indent=1, sort_keys=True)
            os.replace(scratch, self.pins_path)

    def _check_private(self) -> None:
        """Refuse a key directory or key file that other users can write or read: whoever can
        replace the key can speak for this client, whoever can read it can impersonate it."""
        for path, forbidden, what in ((self.directory, 0o022, "writable"),
                                      (self.path, 0o077, "readable")):
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                continue
            if mode & forbidden:
                raise ConfigurationError(
                    f"{path} is {what} by other users; the Noise key must be private to this "
                    f"user (chmod go-rwx), or set noise_key_dir to a private directory")

    def _pins(self) -> Dict[str, str]:
        try:
            with open(self.pins_path) as f:
                pins = json.load(f)
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in pins.items()} if isinstance(pins, dict) else {}


_PSKS: "OrderedDict[bytes, bytes]" = OrderedDict()
_PSKS_LOCK = threading.Lock()
_PSKS_MAX = 64


def cached_psk(password: str, node_id: str) -> bytes:
    """The Noise PSK for this hub and password, derived once per process (argon2id: about
    0.3 s and 64 MiB) and kept in memory only, for at most 64 hub and password pairs."""
    from poorman_handshake.noise import derive_psk
    slot = hashlib.sha256(f"{len(node_id)}:{node_id}:{password}".encode()).digest()
    with _PSKS_LOCK:
        psk = _PSKS.get(slot)
        if psk is not None:
            _PSKS.move_to_end(slot)
            return psk
    psk = derive_psk(password, node_id=node_id)
    with _PSKS_LOCK:
        _PSKS[slot] = psk
        while len(_PSKS) > _PSKS_MAX:
            _PSKS.popitem(last=False)
    return psk
