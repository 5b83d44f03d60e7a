"""Virtualenvs of their own for the hubs the tests start, built once per machine and cached.

One hivemind-core generation per venv, because they cannot share one: hivemind-core 4.0.0 pins
poorman-handshake<2 and hivemind_bus_client<1.0.0, which have no Noise (protocol v3), while the
test process itself runs the current line (requirements.txt). Each venv is built from a pinned
requirements file in tests/ and cached under ~/.cache/hivemind-chat-agent/venvs/, keyed by a
hash of that file, the Python version and this builder's recipe: a changed pin builds a new
venv, an unchanged one is reused, and nothing depends on the cache being there.

    hub-4.0      hivemind-core 4.0.0 and the exact set it ran with (requirements-hub-4.0.txt);
                 the hubs of tests/hubs.py with generation="4.0"
    ovos-hub     the genuine OVOS hub on the 4.0 line (requirements-ovos-hub.txt)
    ovos-hub-5   the genuine OVOS hub on the 5.x line (requirements-ovos-hub-5.txt)
    ovos-stable  ovos-core 2.1.1 and its skills without HiveMind, where tests/test_installs.py
                 installs the client as a persona's environment would get it
    hivescope    the ecosystem's E2E library and the 5.x hub line, where tests/test_hivescope.py
                 drives our hub plugin from a thread with no IO loop
    a2a-persona  ovos-persona 0.9.0a35 with ovos-a2a-solver-plugin 0.0.4a1: an OVOS persona
                 answered by an A2A agent (requirements-a2a-persona.txt)
    a2a-hub-5    hivemind-core 5.3.10a1 with hivemind-a2a-agent-plugin 0.1.6a1 as its agent
                 protocol: a second hub answered by an A2A agent (requirements-a2a-hub-5.txt)
    mqtt-hub-5   hivemind-core 5.3.10a1 with hivemind-mqtt-protocol 0.2.5a2 beside the websocket:
                 the hub of tests/test_mqtt_real.py, running this checkout's hub plugin
    http-hub-5   hivemind-core 5.3.10a1 with hivemind-http-protocol 0.0.20a2 beside the websocket:
                 the hub of tests/test_http_transport.py (tests/http_hub.py), our hub plugin
    redis-db-hub-5  hivemind-core 5.3.10a1 with hivemind-redis-database 0.1.1a8: replicas sharing
                 one client database (tests/test_shared_client_db.py), our hub plugin
    opm3-client  ovos-plugin-manager 3.1.0a1 and the client's dependencies, no ovos-core and no
                 hub (hivemind-core 5.x caps the plugin layer below 3): tests/test_installs.py
                 installs the client there (requirements-opm3-client.txt)

A venv that runs this checkout's code (hub-4.0: our hub plugin, the test pipeline) does not get
the package installed into it. `package_path()` gives a small folder to put first on the hub's
PYTHONPATH instead: a symlink to this checkout's `hivemind_chat_agent` and a dist-info carrying
the entry points that setup.py declares now. So a hub always runs the current source, and one
cached venv serves any number of checkouts, at the same time too.

    python tests/hub_venvs.py [NAME ...]   builds the venvs (all by default), prints their paths

HIVEMIND_CHAT_VENV_<NAME> (HUB_4_0, OVOS_HUB, OVOS_HUB_5, A2A_PERSONA, A2A_HUB_5, MQTT_HUB_5,
HTTP_HUB_5, REDIS_DB_HUB_5, OPM3_CLIENT ...; and, as before, HIVEMIND_CHAT_OVOS_VENV) name a
ready venv to use instead of the cached one.
"""
import configparser
import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)
PACKAGE = "hivemind_chat_agent"

VENVS = {
    "hub-4.0": "requirements-hub-4.0.txt",
    "hub-4.0-noise": "requirements-hub-4.0-noise.txt",
    "ovos-hub": "requirements-ovos-hub.txt",
    "ovos-hub-5": "requirements-ovos-hub-5.txt",
    "ovos-stable": "requirements-ovos-stable.txt",
    "hivescope": "requirements-hivescope.txt",
    "a2a-persona": "requirements-a2a-persona.txt",
    "a2a-hub-5": "requirements-a2a-hub-5.txt",
    "mqtt-hub-5": "requirements-mqtt-hub-5.txt",
    "http-hub-5": "requirements-http-hub-5.txt",
    "opm3-client": "requirements-opm3-client.txt",
    "redis-db-hub-5": "requirements-redis-db-hub-5.txt",
}
# complete pinned sets that contradict a package's declared bounds on purpose
NO_DEPS = {"hub-4.0-noise"}
# bump when the way a venv is built changes (not its pins: those are hashed already)
RECIPE = "1"


def cache_root() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(os.path.abspath(cache), "hivemind-chat-agent")


def requirements_path(name: str) -> str:
    return os.path.join(HERE, VENVS[name])


def _override(name: str):
    var = "HIVEMIND_CHAT_VENV_" + name.upper().replace("-", "_").replace(".", "_")
    value = os.environ.get(var)
    if not value and name == "ovos-hub":
        value = os.environ.get("HIVEMIND_CHAT_OVOS_VENV")   # the name it had before
    return value or None


def _pins(path: str) -> bytes:
    """A requirements file's bytes and those of the files it includes (-r) or is
    constrained by (-c), so a change in either builds a new venv."""
    with open(path, "rb") as f:
        text = f.read()
    for line in text.decode().splitlines():
        if line.startswith(("-r ", "-c ")):
            text += _pins(os.path.join(os.path.dirname(path), line[3:].strip()))
    return text


def venv_path(name: str) -> str:
    override = _override(name)
    if override:
        return override
    digest = hashlib.sha256(_pins(requirements_path(name)) + sys.version.encode() +
                            RECIPE.encode()).hexdigest()
    return os.path.join(cache_root(), "venvs", f"{name}-{digest[:12]}")


def bin_path(name: str, program: str) -> str:
    return os.path.join(venv_path(name), "bin", program)


def ensure_venv(name: str, log=sys.stderr) -> str:
    """The venv `name`, built from its pinned requirements unless a complete one is cached.

    Builds under a lock, so parallel test runs on one machine wait for one build instead of
    racing; a build that failed half way is thrown away and redone."""
    override = _override(name)
    if override:
        return override
    path = venv_path(name)

    def build(out) -> None:
        def run(cmd):
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT)
        run([sys.executable, "-m", "venv", path])
        pip = [os.path.join(path, "bin", "python"), "-m", "pip", "install",
               "--disable-pip-version-check"]
        run(pip + ["--upgrade", "pip", "wheel"])
        run(pip + (["--no-deps"] if name in NO_DEPS else []) + ["-r", requirements_path(name)])
    return built_once(path, f"the {name} venv", build, log)


def built_once(path: str, what: str, build, log=sys.stderr) -> str:
    """`path`, made by `build(out)` (its output to `out`, a log beside `path`) unless a
    complete one is there: under a lock across processes, so parallel runs never race, and
    marked complete only when `build` returned; a build that failed (CalledProcessError) is
    thrown away and raised as RuntimeError with its log's tail. `what` names it in the lines
    printed to `log`. tests/ha_runtime.py builds its chroot through it too."""
    marker = os.path.join(path, ".complete")
    if os.path.exists(marker):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(marker):   # another process built it while we waited
            return path
        shutil.rmtree(path, ignore_errors=True)
        started = time.monotonic()
        print(f"building {what} at {path} …", file=log, flush=True)
        build_log = path + ".build.log"
        try:
            with open(build_log, "w") as out:
                build(out)
        except subprocess.CalledProcessError as e:
            with open(build_log, errors="replace") as f:
                tail = f.read()[-4000:]
            shutil.rmtree(path, ignore_errors=True)
            raise RuntimeError(f"building {what} failed ({e}); from {build_log}:\n"
                               f"{tail}") from None
        with open(marker, "w") as f:
            f.write(str(time.time()))
        print(f"{what} ready in {time.monotonic() - started:.0f} s", file=log, flush=True)
    return path


# ---- this checkout's package, for a venv that must run it without installing it ----

def _setup_kwargs(checkout: str) -> dict:
    """What setup.py passes to setup(), read without setuptools and without installing."""
    captured = {}
    fake = types.ModuleType("setuptools")
    fake.setup = lambda **kw: captured.update(kw)
    fake.find_packages = lambda *a, **kw: []
    saved = sys.modules.get("setuptools")
    sys.modules["setuptools"] = fake
    try:
        path = os.path.join(checkout, "setup.py")
        with open(path) as f:
            code = compile(f.read(), path, "exec")
        exec(code, {"__name__": "__main__", "__file__": path})
    finally:
        if saved is None:
            sys.modules.pop("setuptools", None)
        else:
            sys.modules["setuptools"] = saved
    return captured


def _dist_info(checkout: str):
    kw = _setup_kwargs(checkout)
    name, version = kw["name"], kw["version"]
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    for group, entries in sorted((kw.get("entry_points") or {}).items()):
        parser[group] = dict(e.split("=", 1) for e in (s.replace(" ", "") for s in entries))
    buf = io.StringIO()
    parser.write(buf)
    folder = f"{name.replace('-', '_')}-{version}.dist-info"
    return folder, {"METADATA": metadata, "entry_points.txt": buf.getvalue(),
                    "top_level.txt": PACKAGE + "\n"}


def package_path(checkout: str = CHECKOUT) -> str:
    """A folder that, first on PYTHONPATH, makes a venv import this checkout's package (its
    current source) and see its entry points (as setup.py declares them now)."""
    checkout = os.path.realpath(checkout)
    folder, files = _dist_info(checkout)
    digest = hashlib.sha256(repr((checkout, folder, sorted(files.items()))).encode())
    path = os.path.join(cache_root(), "packages", digest.hexdigest()[:16])
    if os.path.isdir(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(path))
    os.symlink(os.path.join(checkout, PACKAGE), os.path.join(tmp, PACKAGE))
    os.mkdir(os.path.join(tmp, folder))
    for name, text in files.items():
        with open(os.path.join(tmp, folder, name), "w") as f:
            f.write(text)
    try:
        os.rename(tmp, path)
    except OSError:   # another process made the same folder first: same content
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def main(argv) -> int:
    names = argv or list(VENVS)
    unknown = [n for n in names if n not in VENVS]
    if unknown:
        print(f"unknown venv {unknown}; known: {', '.join(VENVS)}", file=sys.stderr)
        return 2
    for name in names:
        started = time.monotonic()
        path = ensure_venv(name)
        print(f"{name}\t{path}\t({time.monotonic() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
