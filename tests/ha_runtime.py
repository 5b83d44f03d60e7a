"""A genuine Home Assistant for the native integration's tests, built once per machine and cached.

Home Assistant 2026.3 and newer need Python >= 3.14.2, which Debian bookworm does not have, so
the runtime is a Debian sid chroot (debootstrap, minbase) with Debian's python3.14 and a venv
in it, /opt/ha, holding the complete pinned set of tests/requirements-home-assistant.txt
(homeassistant, what default_config's integrations need, this package's dependencies) and this
package installed beside it, so `pip check` there covers our install_requires against HA's pins.
The tests run `hass` in the chroot (it shares the host's network: a hub on 127.0.0.1 is
reachable) with this checkout's current source first on its PYTHONPATH (ha_process.py).

Cached under ~/.cache/hivemind-chat-agent/home-assistant/, keyed by a hash of the requirements
file, setup.py and RECIPE: a changed pin builds a new runtime, an unchanged one is reused,
nothing depends on the cache being there. Builds run under a lock (parallel test runs wait for
one build); a build that failed half way is thrown away and redone. Nothing is ever mounted
into the chroot (debootstrap's /dev nodes suffice), so removing it touches nothing outside.

Packages are fetched by uv inside the chroot with the host's CA bundle (PIP_CERT, else the
system's): Python 3.14's pip verifies certificates strictly (VERIFY_X509_STRICT), which a
TLS-inspecting proxy's CA may fail. uv itself comes from the host's pip (`pip download`).
Needs root (chroot), debootstrap and Debian's package mirror (HIVEMIND_CHAT_DEBIAN_MIRROR).

    python tests/ha_runtime.py     builds the runtime (if needed), prints its path and time;
                                   where it cannot be built (not root ...) says why, exits 0

HIVEMIND_CHAT_HA_ROOT names a ready chroot to use instead of the cached one.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hub_venvs  # noqa: E402  (built_once: the same locked, marked, cached build)

CHECKOUT = os.path.dirname(HERE)
REQUIREMENTS = os.path.join(HERE, "requirements-home-assistant.txt")
SUITE = "sid"
PYTHON = "python3.14"
# g++ and the headers: pymicro-vad and pyspeex-noise (assist_pipeline) have no cp314 wheels;
# libturbojpeg and libpcap: the camera's and dhcp's libraries (they log errors without them)
DEBIAN_PACKAGES = (PYTHON, f"{PYTHON}-venv", f"{PYTHON}-dev", "g++", "ca-certificates",
                   "libturbojpeg0", "libpcap0.8t64")
VENV = "/opt/ha"                # inside the chroot
CA_BUNDLE = "/etc/ssl/host-ca.crt"   # inside the chroot: the host's bundle, for uv
# bump when the way the runtime is built changes (not its pins: those are hashed already)
RECIPE = "1"


class RuntimeUnavailable(RuntimeError):
    """This machine cannot build the runtime (not root, no debootstrap); the message says why."""


def cache_root() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(os.path.abspath(cache), "hivemind-chat-agent", "home-assistant")


def root_path() -> str:
    """The chroot's folder: HIVEMIND_CHAT_HA_ROOT, or the cached one for the current pins."""
    override = os.environ.get("HIVEMIND_CHAT_HA_ROOT")
    if override:
        return override
    digest = hashlib.sha256()
    for path in (REQUIREMENTS, os.path.join(CHECKOUT, "setup.py")):
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(f"{SUITE} {DEBIAN_PACKAGES} {RECIPE}".encode())
    return os.path.join(cache_root(), f"ha-{digest.hexdigest()[:12]}")


def pinned(name: str) -> str:
    """The version requirements-home-assistant.txt pins for `name`."""
    with open(REQUIREMENTS) as f:
        for line in f:
            if line.split("==")[0].strip().lower() == name.lower():
                return line.strip()
    raise KeyError(f"{name} is not pinned in {REQUIREMENTS}")


def unavailable_reason() -> str:
    """Why this machine cannot build the runtime, or "" when it can."""
    if os.environ.get("HIVEMIND_CHAT_HA_ROOT"):
        return ""
    if os.geteuid() != 0:
        return "building the Home Assistant chroot needs root (chroot, debootstrap)"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (apt-get install debootstrap)"
    return ""


def host_ca_bundle() -> str:
    return os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or \
        "/etc/ssl/certs/ca-certificates.crt"


def ensure_runtime(log=sys.stderr) -> str:
    """The chroot's folder, built unless a complete one is cached; RuntimeUnavailable when
    this machine cannot build it, RuntimeError (with the build log's tail) when a build failed."""
    root = root_path()
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        return root
    reason = unavailable_reason()
    if reason:
        raise RuntimeUnavailable(reason)
    return hub_venvs.built_once(root, "the Home Assistant runtime",
                                lambda out: _build(root, out), log)


def _build(root: str, out) -> None:
    def run(cmd, **kw):
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT, **kw)

    def in_root(*cmd):
        run(["chroot", root, "/usr/bin/env", f"SSL_CERT_FILE={CA_BUNDLE}", "HOME=/root",
             *cmd])
    mirror = os.environ.get("HIVEMIND_CHAT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    run(["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", SUITE,
         root, mirror])
    shutil.copyfile(host_ca_bundle(), root + CA_BUNDLE)
    in_root(f"/usr/bin/{PYTHON}", "-m", "venv", VENV)
    wheels = os.path.join(root, "tmp", "wheels")
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
         "--platform", "manylinux_2_17_x86_64", "-d", wheels, pinned("uv")])
    in_root(f"{VENV}/bin/python", "-m", "pip", "install", "--no-index", "--find-links",
            "/tmp/wheels", pinned("uv"))
    shutil.copyfile(REQUIREMENTS, os.path.join(root, "tmp", "requirements.txt"))
    uv = [f"{VENV}/bin/uv", "pip", "install", "--python", f"{VENV}/bin/python"]
    in_root(*uv, "--no-deps", "-r", "/tmp/requirements.txt")
    # this package beside it (its metadata, for pip check; the tests run the current source)
    source = os.path.join(root, "tmp", "src")
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(os.path.join(CHECKOUT, "hivemind_chat_agent"),
                    os.path.join(source, "hivemind_chat_agent"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "README.md"):
        shutil.copyfile(os.path.join(CHECKOUT, name), os.path.join(source, name))
    in_root(*uv, "--no-deps", "/tmp/src")
    in_root(f"{VENV}/bin/python", "-m", "pip", "check")
    shutil.rmtree(source)
    shutil.rmtree(wheels)


def main() -> int:
    started = time.monotonic()
    try:
        root = ensure_runtime()
    except RuntimeUnavailable as e:      # not an error: the tests that need it skip
        print(f"no Home Assistant runtime on this machine ({e}); its tests will skip",
              file=sys.stderr)
        return 0
    print(f"home-assistant\t{root}\t({time.monotonic() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
