"""The demo's learned AIML brain kept in a file, so a start reads it instead of learning the
ALICE set again, many times slower (docs/performance.md, the demo's start).

One file per key, `aiml-brain-<key>.bin` in the cache folder; the key is a digest of what the
brain is made of and what reads it: this file format, the aiml kernel's version, the Python
version (marshal's format is Python's own) and the name and bytes of every AIML file learned,
so an upgrade of any of them finds no file and learns anew. The file is

    FORMAT (a line naming this format), the key and a newline, the SHA-256 of the payload,
    the payload

with the payload `marshal.dumps((template_count, bot_name, root))`. A file that is short, of
another key, or whose payload does not match its digest is not read: the caller learns and
writes it again. Writes go to a temporary file in the same folder, flushed to disk, then
renamed over the old name, so a process starting at the same time reads the whole old brain,
the whole new one or none, never half of one.

Brains of other keys (an upgraded aiml or Python, changed files) are 12 MB each and would pile
up: a brain read is marked used (its file's modification time), and each write keeps the
KEPT_BRAINS most recently used and deletes the rest. More than one is kept because several
installs may share the folder (the quick start on two Pythons has a key each): keeping only
the newest would make them learn in turn at every start.

aiml 0.9.2's PatternMgr (the kernel's `_brain`) keeps its whole state in three fields, the ones
its own `save`/`restore` write with marshal in this order. Its `restore` reads the file through
`marshal.load`, object by object, no faster than learning; one `marshal.loads` of the bytes read
at once is an order of magnitude faster. So `take` and `install`
read and set those three fields themselves; `fits` says whether this aiml still has them
(otherwise the engine learns without a cache).
"""
import gc
import hashlib
import marshal
import os
import sys
import tempfile
from typing import NamedTuple, Optional, Sequence

from ovos_utils.log import LOG

FORMAT = b"hivemind-chat-agent aiml brain 1\n"
KEPT_BRAINS = 4     # brains of other keys beyond these, least recently used first, are deleted
_DIGEST = hashlib.sha256().digest_size
_FIELDS = ("_templateCount", "_botName", "_root")


class Brain(NamedTuple):
    """What aiml's PatternMgr learned: its template count, bot name and pattern tree."""
    template_count: int
    bot_name: str
    root: dict


def default_cache_dir() -> str:
    """hivemind-chat-agent under the user's XDG cache folder ($XDG_CACHE_HOME if it is an
    absolute path, as the XDG spec requires, else ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hivemind-chat-agent")


def brain_key(sources: Sequence[str], aiml_version: str) -> str:
    """The hex digest naming the brain learned from `sources` (paths, in learning order) by
    the aiml that calls itself `aiml_version` (its `Kernel.version()`) on this Python."""
    digest = hashlib.sha256(FORMAT)
    digest.update(f"aiml {aiml_version}\n".encode())
    digest.update(f"python {sys.version_info[0]}.{sys.version_info[1]} "
                  f"marshal {marshal.version}\n".encode())
    for path in sources:
        with open(path, "rb") as f:
            content = f.read()
        digest.update(f"{os.path.basename(path)} {len(content)}\n".encode())
        digest.update(content)
    return digest.hexdigest()


def brain_path(cache_dir: str, key: str) -> str:
    return os.path.join(cache_dir, f"aiml-brain-{key}.bin")


def _share_strings(value, strings: dict):
    """`value` (dicts, lists, tuples, strings, ints) with equal strings made one object, in
    place where it can be (dicts and lists; a tuple is rebuilt): equal in value, so aiml
    matches as before. marshal writes a string met again as a reference to the first, so the
    brain read back holds each word once (ALICE: 34 MiB less, file 8% smaller) where learning
    made a new string for each pattern and template that uses it; done in place, the learned
    kernel shrinks as well instead of a copy costing 80 MiB more at its peak."""
    if isinstance(value, str):
        return strings.setdefault(value, value)
    if isinstance(value, dict):
        items = [(_share_strings(k, strings), _share_strings(v, strings))
                 for k, v in value.items()]
        value.clear()
        value.update(items)
    elif isinstance(value, list):
        value[:] = [_share_strings(item, strings) for item in value]
    elif isinstance(value, tuple):
        return tuple(_share_strings(item, strings) for item in value)
    return value


def encode(key: str, brain: Brain) -> bytes:
    """The file's bytes for `brain` under `key` (its equal strings made one object)."""
    payload = marshal.dumps(_share_strings(tuple(brain), {}))
    return FORMAT + key.encode("ascii") + b"\n" + hashlib.sha256(payload).digest() + payload


def decode(data: bytes, key: str) -> Optional[Brain]:
    """The brain in `data` if it is a whole file of this format and `key`, else None."""
    header = FORMAT + key.encode("ascii") + b"\n"
    if not data.startswith(header):
        return None
    digest = data[len(header):len(header) + _DIGEST]
    payload = memoryview(data)[len(header) + _DIGEST:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        value = _load_outside_collector(payload)
    except (EOFError, ValueError, TypeError):
        return None
    if (not isinstance(value, tuple) or len(value) != 3 or not isinstance(value[0], int)
            or not isinstance(value[1], str) or not isinstance(value[2], dict)):
        return None
    return Brain(*value)


def _load_outside_collector(payload) -> object:
    """`marshal.loads(payload)` for a brain that lives as long as the process: its 2.7 million
    containers are moved (with everything else alive now) into the collector's permanent
    generation (`gc.freeze`), where no collection walks them. Left young, the first collection
    after loading walks them all, then the next generation's: 1.5-2 s of a 2 s start on a busy
    machine, for objects that hold no cycles and are freed by their reference counts as ever."""
    collecting = gc.isenabled()
    gc.disable()      # nor while loading: each collection would walk what is loaded so far
    try:
        value = marshal.loads(payload)
        gc.freeze()
    finally:
        if collecting:
            gc.enable()
    return value


def read(path: str, key: str) -> Optional[Brain]:
    """The brain cached at `path` under `key`, or None if there is none or it is unsound."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        LOG.warning(f"the demo's AIML brain cache {path} is unreadable "
                    f"({type(e).__name__}: {e}); learning it again")
        return None
    brain = decode(data, key)
    if brain is None:
        LOG.warning(f"the demo's AIML brain cache {path} is damaged; learning it again")
        return None
    try:
        os.utime(path)      # used now: the last brain `prune` deletes
    except OSError:
        pass
    return brain


def write(path: str, key: str, brain: Brain) -> None:
    """Put `brain` at `path` atomically (temporary file, fsync, rename). Raises OSError."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".aiml-brain-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(encode(key, brain))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    prune(folder, keep=KEPT_BRAINS)


def prune(folder: str, keep: int) -> None:
    """Delete the brain files in `folder` beyond the `keep` most recently used (a file another
    process deletes or replaces meanwhile is skipped; nothing here raises)."""
    used = []
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.startswith("aiml-brain-") and name.endswith(".bin"):
            path = os.path.join(folder, name)
            try:
                used.append((os.stat(path).st_mtime, path))
            except OSError:
                continue
    for _, path in sorted(used, reverse=True)[keep:]:
        try:
            os.unlink(path)
        except OSError:
            pass


def fits(kernel) -> bool:
    """Whether this aiml keeps its brain in the fields `take` and `install` use."""
    patterns = getattr(kernel, "_brain", None)
    return patterns is not None and all(hasattr(patterns, name) for name in _FIELDS)


def take(kernel) -> Brain:
    """The brain `kernel` has learned."""
    patterns = kernel._brain
    return Brain(*(getattr(patterns, name) for name in _FIELDS))


def install(kernel, brain: Brain) -> None:
    """Make `kernel` hold `brain`, as aiml's own `loadBrain` does."""
    patterns = kernel._brain
    for name, value in zip(_FIELDS, brain, strict=True):
        setattr(patterns, name, value)
