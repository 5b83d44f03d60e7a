"""Screenshots of the integration's config flow, taken from the real Home Assistant frontend
(the genuine `hass` of tests/ha_process.py) in headless Chromium, for docs/images/. Not a test.

    python tests/ha_screenshots.py [OUT_DIR]      # default: docs/images

Needs root (the HA chroot), Debian's chromium and chromium-driver (/usr/bin/chromium,
/usr/bin/chromedriver), driven through ChromeDriver's W3C HTTP API with the standard
library only. It finishes HA's onboarding through its REST API, hands the frontend the
owner's tokens (localStorage `hassTokens`, as the login page leaves them), opens
*Add integration → HiveMind Chat* and saves the form; then types a hub's address with a
wrong password, submits, and saves the form showing its error.
"""
import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ha_runtime  # noqa: E402
from ha_process import CLIENT_ID, HomeAssistantProcess  # noqa: E402
from hubs import HubProcess, free_port  # noqa: E402

CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--window-size=1100,900",
               "--hide-scrollbars"]
# the dialog's form fields, deep in the frontend's shadow roots
FIND_DEEP = """
const find = (root, sel) => {
  const hit = root.querySelector(sel); if (hit) return hit;
  for (const el of root.querySelectorAll('*')) {
    if (el.shadowRoot) { const f = find(el.shadowRoot, sel); if (f) return f; }
  }
  return null;
};
"""


class Driver:
    """A ChromeDriver session (W3C WebDriver over HTTP)."""

    def __init__(self, port: int, user_data_dir: str):
        self.base = f"http://127.0.0.1:{port}"
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": CHROME_ARGS + [f"--user-data-dir={user_data_dir}"]}}}}
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)["value"]

    def go(self, url: str) -> None:
        self.call("POST", f"/session/{self.session}/url", {"url": url})

    def js(self, script: str, *args: Any) -> Any:
        return self.call("POST", f"/session/{self.session}/execute/sync",
                         {"script": script, "args": list(args)})

    def wait_js(self, script: str, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(script)
            if value:
                return value
            time.sleep(0.25)
        raise RuntimeError(f"the page never had: {script}")

    def screenshot(self, path: str) -> None:
        png = self.call("GET", f"/session/{self.session}/screenshot")
        with open(path, "wb") as f:
            f.write(base64.b64decode(png))

    def quit(self) -> None:
        self.call("DELETE", f"/session/{self.session}")


def finish_onboarding(ha: HomeAssistantProcess) -> None:
    """The onboarding steps after the owner, so the frontend opens HA itself."""
    ha.request("POST", "/api/onboarding/core_config", {})
    ha.request("POST", "/api/onboarding/analytics", {})
    ha.request("POST", "/api/onboarding/integration",
               {"client_id": CLIENT_ID, "redirect_uri": CLIENT_ID + "?auth_callback=1"})


def hand_tokens(driver: Driver, ha: HomeAssistantProcess) -> None:
    tokens: Dict[str, Any] = {**ha.tokens, "hassUrl": ha.base, "clientId": CLIENT_ID,
                              "expires": int(time.time() * 1000) + 1800 * 1000}
    driver.go(ha.base + "/robots.txt")       # the origin, before the app loads
    driver.js("localStorage.setItem('hassTokens', arguments[0]);", json.dumps(tokens))


CLICK_TEXT = FIND_DEEP + """
const all = (root, out) => {
  for (const el of root.querySelectorAll('*')) {
    out.push(el); if (el.shadowRoot) all(el.shadowRoot, out);
  }
  return out;
};
const hit = all(document, []).filter(el => /^(HA-BUTTON|MWC-BUTTON|BUTTON)$/.test(el.tagName)
  && el.textContent.trim() === arguments[0]).pop();
if (hit) hit.click();
return !!hit;
"""


def click(driver: Driver, text: str, timeout: float = 30) -> None:
    """Click the (last, innermost) button that says `text`, once there is one."""
    deadline = time.monotonic() + timeout
    while not driver.js(CLICK_TEXT, text):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no button says {text!r}")
        time.sleep(0.25)


INPUTS = """
const all = (root, out) => {
  for (const el of root.querySelectorAll('*')) {
    out.push(el); if (el.shadowRoot) all(el.shadowRoot, out);
  }
  return out;
};
return all(document, []).filter(el => el.tagName === 'INPUT' && el.type !== 'hidden'
  && el.closest && !el.closest('search-input'));
"""


def type_into(driver: Driver, values: List[str]) -> None:
    """Type each of `values` into the form's text inputs, in order (real key events, as a
    user's, so the frontend's fields take them)."""
    inputs = driver.js(INPUTS)[-len(values):]
    for element, value in zip(inputs, values, strict=True):
        ref = next(iter(element.values()))
        driver.call("POST", f"/session/{driver.session}/element/{ref}/clear", {})
        driver.call("POST", f"/session/{driver.session}/element/{ref}/value", {"text": value})


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    ha = HomeAssistantProcess(ha_runtime.ensure_runtime()).start()
    hub = HubProcess().start()
    port = free_port()
    chromedriver = subprocess.Popen(["/usr/bin/chromedriver", f"--port={port}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver = None
    try:
        ha.onboard()
        finish_onboarding(ha)
        creds = hub.add_client()
        time.sleep(1)
        driver = Driver(port, os.path.join(ha.folder, "chromium"))
        hand_tokens(driver, ha)
        driver.go(ha.base + "/config/integrations/dashboard/add?domain=hivemind_chat")
        click(driver, "OK")        # "Do you want to set up HiveMind Chat (OVOS hub)?"
        driver.wait_js(FIND_DEEP + "return !!find(document, 'ha-form [name=\"host\"], "
                                   "[name=\"access_key\"]');", 60)
        time.sleep(1.5)            # the dialog's opening animation
        driver.screenshot(os.path.join(out_dir, "ha_config_flow.png"))
        type_into(driver, ["127.0.0.1", str(hub.port), creds.key, "not-the-password"])
        click(driver, "Submit")
        driver.wait_js(FIND_DEEP + "const f = find(document, 'step-flow-form');"
                                   "return f && f.shadowRoot && "
                                   "!!find(f.shadowRoot, 'ha-alert');", 30)
        time.sleep(0.5)
        driver.screenshot(os.path.join(out_dir, "ha_config_flow_invalid_auth.png"))
    except Exception:
        if driver is not None:    # what the page showed instead
            driver.screenshot(os.path.join(out_dir, "failed.png"))
            print("at", driver.js("return location.href;"), file=sys.stderr)
        raise
    finally:
        if driver is not None:
            driver.quit()
        chromedriver.terminate()
        chromedriver.wait(10)
        hub.cleanup()
        ha.cleanup()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else
         os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "images"))
