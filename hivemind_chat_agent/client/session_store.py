"""Conversations that outlive the process: one small JSON file per session, per client.

`hivemind-chat --session S` runs are separate processes; without this, each would start the
conversation afresh (no active skills, no intent context). The store is keyed by hub address and
access key (hashed), so two clients sharing a machine or a state dir never read each other's
sessions, and it is bounded in count and age. Files are written atomically, readable only by
their owner, and hold nothing but what the hub already sent back (no key, no password).
"""
import hashlib
import json
import os
import tempfile
import time
from typing import Any, Dict, Optional

from ovos_utils.log import LOG
from ovos_utils.xdg_utils import xdg_state_home

MAX_FILE_BYTES = 1_000_000   # a Session is a few kB; anything larger is not ours


def default_store_dir() -> str:
    """$XDG_STATE_HOME/hivemind-chat/sessions (~/.local/state/... when unset)."""
    return os.path.join(xdg_state_home(), "hivemind-chat", "sessions")


class SessionStore:
    def __init__(self, directory: str, host: str, port: int, access_key: str,
                 max_sessions: int = 1000, ttl: float = 30 * 86400):
        client = hashlib.sha256(f"{host}:{port}\0{access_key}".encode()).hexdigest()[:24]
        self.path = os.path.join(os.path.abspath(os.path.expanduser(directory)), client)
        self.max_sessions = max_sessions
        self.ttl = ttl
        self._saves = 0

    def _file(self, session_id: str) -> str:
        name = hashlib.sha256(session_id.encode()).hexdigest()[:32]
        return os.path.join(self.path, f"{name}.json")

    def load(self, session_id: str) -> Optional[Dict[str, Any]]:
        path = self._file(session_id)
        try:
            if time.time() - os.path.getmtime(path) > self.ttl:
                os.unlink(path)
                return None
            if os.path.getsize(path) > MAX_FILE_BYTES:
                return None
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("session_id") != session_id:
            return None    # a hash collision or a file that is not ours
        session = record.get("session")
        return session if isinstance(session, dict) else None

    def save(self, session_id: str, session: Dict[str, Any]) -> None:
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")
            try:
                with os.fdopen(fd, "w") as f:   # mkstemp: mode 0600
                    json.dump({"session_id": session_id, "saved": time.time(),
                               "session": session}, f)
                os.replace(tmp, self._file(session_id))
            except BaseException:
                os.unlink(tmp)
                raise
        except (OSError, TypeError, ValueError) as e:
            LOG.warning(f"could not save session {session_id!r} to {self.path}: "
                        f"{type(e).__name__}; the conversation continues in this process only")
            return
        self._saves += 1
        if self._saves % 50 == 1:
            self.prune()

    def prune(self) -> int:
        """Drop expired sessions, then the least recently saved beyond `max_sessions`."""
        try:
            entries = [e for e in os.scandir(self.path) if e.name.endswith(".json")]
        except OSError:
            return 0
        now, removed = time.time(), 0
        dated = []
        for entry in entries:
            try:
                mtime = entry.stat().st_mtime
            except OSError:
                continue
            if now - mtime > self.ttl:
                removed += self._unlink(entry.path)
            else:
                dated.append((mtime, entry.path))
        dated.sort()
        for _, path in dated[:max(0, len(dated) - self.max_sessions)]:
            removed += self._unlink(path)
        return removed

    @staticmethod
    def _unlink(path: str) -> int:
        try:
            os.unlink(path)
            return 1
        except OSError:
            return 0
