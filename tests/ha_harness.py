"""Home Assistant's own test harness (pytest-homeassistant-custom-component) in the chroot of
ha_runtime.py, and a run of tests/ha_component/ with it, for the host-side test that drives it
(test_home_assistant_harness.py).

The harness is a layer beside the runtime's venv: tests/requirements-home-assistant-tests.txt
(why beside, not in it: that file says) installed by uv with --no-deps into /opt/ha-tests-HASH
inside the chroot, HASH that file's, built once (hub_venvs.built_once, under its lock) into
the runtime already built; the runtime's own cache key does not change, nor its `pip check`.

`run_component_tests` copies tests/ha_component/ with this checkout's
custom_components/hivemind_chat and hivemind_chat_agent into a folder of their own under the
chroot's /tmp (parallel runs never share one) and runs the chroot's Python 3.14 `-m pytest`
there, the layer and that folder on its PYTHONPATH, `env` passed in (a hub's address and a
client's credentials: redacted from what is reported, and short tracebacks, which show no
fixture values), its JUnit XML read back so a failure is reported with the inner test's name
and message.
"""
import hashlib
import os
import secrets
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import ha_runtime
import hub_venvs

TEST_REQUIREMENTS = os.path.join(ha_runtime.HERE, "requirements-home-assistant-tests.txt")
COMPONENT_TESTS = os.path.join(ha_runtime.HERE, "ha_component")
# ha_component/compat.py before pytest loads the harness's plugin (what 0.13.375, made for
# HA 2026.10.4, expects of 2026.11.0 that moved: that module says)
LAUNCHER = "import sys, ha_component.compat, pytest; sys.exit(pytest.main(sys.argv[1:]))"


def layer_path() -> str:
    """The layer's folder, as the chroot sees it: keyed by the requirements file's hash."""
    with open(TEST_REQUIREMENTS, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    return f"/opt/ha-tests-{digest}"


def ensure_test_layer(root: str) -> str:
    """The layer's folder inside `root` (chroot's view), installed unless complete already;
    RuntimeError with the build log's tail when the install failed."""
    inside = layer_path()

    def build(out) -> None:
        shutil.copyfile(TEST_REQUIREMENTS, root + inside + ".txt")
        cmd = ["chroot", root, "/usr/bin/env", f"SSL_CERT_FILE={ha_runtime.CA_BUNDLE}",
               "HOME=/root", f"{ha_runtime.VENV}/bin/uv", "pip", "install", "--python",
               f"{ha_runtime.VENV}/bin/python", "--no-deps", "--target", inside, "-r",
               inside + ".txt"]
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT)
    hub_venvs.built_once(root + inside, "Home Assistant's test harness", build)
    return inside


@dataclass
class InnerRun:
    """What the inner pytest did: its exit code, each test's outcome, its output's tail."""

    returncode: int
    outcomes: Dict[str, str] = field(default_factory=dict)   # test id -> passed/failed/...
    failures: List[Tuple[str, str]] = field(default_factory=list)   # (test id, message)
    output: str = ""

    def report(self) -> str:
        """The failures readably: each inner test's id and its message, then the tail."""
        lines = [f"inner pytest exited {self.returncode}; "
                 f"{sum(v == 'passed' for v in self.outcomes.values())} passed, "
                 f"{len(self.failures)} failed or errored"]
        for name, message in self.failures:
            lines += [f"--- {name}", message[-3000:]]
        return "\n".join(lines + ["--- output's tail", self.output[-3000:]])


def _copy_sources(folder: str) -> None:
    checkout = ha_runtime.CHECKOUT
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(COMPONENT_TESTS, os.path.join(folder, "ha_component"), ignore=ignore)
    shutil.copytree(os.path.join(checkout, "custom_components", "hivemind_chat"),
                    os.path.join(folder, "custom_components", "hivemind_chat"), ignore=ignore)
    shutil.copytree(os.path.join(checkout, "hivemind_chat_agent"),
                    os.path.join(folder, "hivemind_chat_agent"), ignore=ignore)
    # a regular package, first on the path: HA's loader imports `custom_components` and the
    # harness's own testing_config has one (a namespace package would lose to it)
    with open(os.path.join(folder, "custom_components", "__init__.py"), "w") as f:
        f.write('"""The custom integrations under test."""\n')


def _redact(text: str, secrets_: List[str]) -> str:
    for value in secrets_:
        text = text.replace(value, "***")
    return text


def _read_junit(path: str, run: InnerRun) -> None:
    if not os.path.exists(path):
        return
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
                if child.tag != "skipped":
                    run.failures.append((name, (child.get("message") or "") + "\n" +
                                         (child.text or "")))
        run.outcomes[name] = outcome


def run_component_tests(root: str, env: Dict[str, str], args: Optional[List[str]] = None,
                        timeout: float = 600) -> InnerRun:
    """Run tests/ha_component/ in the chroot with the harness (see the module's docstring);
    `args` more pytest arguments (-k ...). The folder is removed afterwards."""
    layer = ensure_test_layer(root)
    inside = f"/tmp/ha-pytest-{secrets.token_hex(4)}"
    folder = root + inside
    try:
        _copy_sources(folder)
        os.makedirs(os.path.join(folder, "home"))
        base = {"HOME": inside + "/home", "PATH": f"{ha_runtime.VENV}/bin:/usr/bin:/bin",
                "PYTHONPATH": f"{inside}:{layer}", "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = ["chroot", root, "/usr/bin/env", "-i",
               *[f"{k}={v}" for k, v in {**base, **env}.items()],
               "/bin/sh", "-c", 'cd "$0" && exec "$@"', inside,
               f"{ha_runtime.VENV}/bin/python", "-c", LAUNCHER, "-q", "--tb=short",
               "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", "--rootdir", inside,
               f"--junitxml={inside}/junit.xml", "ha_component", *(args or [])]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, text=True, errors="replace")
        run = InnerRun(proc.returncode, output=proc.stdout)
        _read_junit(os.path.join(folder, "junit.xml"), run)
        hidden = [v for k, v in env.items() if v and ("KEY" in k or "PASSWORD" in k)]
        run.output = _redact(run.output, hidden)
        run.failures = [(name, _redact(message, hidden)) for name, message in run.failures]
        return run
    finally:
        shutil.rmtree(folder, ignore_errors=True)
