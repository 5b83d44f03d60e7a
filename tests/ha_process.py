"""A genuine Home Assistant process for the tests: `hass` inside the chroot of ha_runtime.py,
on a free port of 127.0.0.1 (the chroot shares the host's network, so it reaches the test
hubs), with this checkout's custom_components/hivemind_chat copied into its config folder and
this checkout's package source first on its PYTHONPATH, driven through HA's own REST API
(onboarding creates the owner and gives the token, and the HTTP settings are confirmed;
config entries flows; conversation/process; Assist pipeline runs over the websocket API).

Each instance has a folder of its own under the chroot's /tmp (config, HOME, the source), so
parallel runs never share one; cleanup() removes it.
"""
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

import ha_runtime
from hubs import free_port
from spawned import record

CLIENT_ID = "http://127.0.0.1/"    # an OAuth client id HA accepts for the onboarding user


class HomeAssistantProcess:
    def __init__(self, root: str, hass_args=("--skip-pip",)):
        self.root = root
        self.inside = f"/tmp/ha-test-{secrets.token_hex(4)}"    # the folder, chroot's view
        self.folder = root + self.inside
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.hass_args = list(hass_args)
        self.token: Optional[str] = None
        self.tokens: Dict[str, Any] = {}
        self.proc: Optional[subprocess.Popen] = None
        self.started_in: Optional[float] = None    # seconds the last start took
        config = os.path.join(self.folder, "config")
        os.makedirs(os.path.join(config, "custom_components"))
        os.makedirs(os.path.join(self.folder, "home"))
        with open(os.path.join(config, "configuration.yaml"), "w") as f:
            f.write("default_config:\n"
                    f"http:\n  server_host: 127.0.0.1\n  server_port: {self.port}\n"
                    "logger:\n  default: warning\n  logs:\n"
                    "    custom_components.hivemind_chat: debug\n")
        shutil.copytree(os.path.join(ha_runtime.CHECKOUT, "custom_components", "hivemind_chat"),
                        os.path.join(config, "custom_components", "hivemind_chat"))
        shutil.copytree(os.path.join(ha_runtime.CHECKOUT, "hivemind_chat_agent"),
                        os.path.join(self.folder, "src", "hivemind_chat_agent"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.log_path = os.path.join(self.folder, "hass.log")

    def start(self, timeout: float = 180) -> "HomeAssistantProcess":
        """Start `hass` and wait until its HTTP API answers (RuntimeError with its log's tail
        when it exits or does not answer in `timeout`)."""
        env = ["HOME=" + self.inside + "/home", "PATH=/opt/ha/bin:/usr/bin:/bin",
               "PYTHONPATH=" + self.inside + "/src", "LANG=C.UTF-8"]
        cmd = ["chroot", self.root, "/usr/bin/env", "-i", *env, "/opt/ha/bin/hass", "-c",
               self.inside + "/config", *self.hass_args]
        if shutil.which("unshare"):   # /proc for hass, in a mount namespace of its own only
            cmd = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                   'mount -t proc proc "$1/proc" && exec chroot "$@"', "sh",
                   *cmd[1:]]
        began = time.monotonic()
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        record(self.proc, self.folder)
        log.close()
        while time.monotonic() - began < timeout:
            if self.proc.poll() is not None:
                break
            try:
                urllib.request.urlopen(self.base + "/api/onboarding", timeout=1).read()
                self.started_in = time.monotonic() - began
                return self
            except urllib.error.HTTPError:
                self.started_in = time.monotonic() - began
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"hass did not start (exit code {self.proc.poll()}):\n"
                           f"{self.logs()[-4000:]}")

    def onboard(self) -> str:
        """Create the owner through HA's onboarding API and keep its access token."""
        _status, body = self.request("POST", "/api/onboarding/users", {
            "client_id": CLIENT_ID, "name": "Test", "username": "test",
            "password": secrets.token_hex(8), "language": "en"}, auth=False)
        form = urllib.parse.urlencode({"grant_type": "authorization_code",
                                       "code": body["auth_code"], "client_id": CLIENT_ID})
        req = urllib.request.Request(self.base + "/auth/token", data=form.encode(),
                                     method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            tokens = json.load(resp)
        self.token = tokens["access_token"]
        self.tokens = tokens       # the frontend takes them whole (tests/ha_screenshots.py)
        self.confirm_http_config()
        return self.token

    def confirm_http_config(self) -> None:
        """Confirm the HTTP settings of configuration.yaml. HA 2026.11 moves them into its
        store as a *pending* config on the first start and, unless the user confirms it within
        5 minutes (http/config/promote), reverts to the stable one (port 8123 on all
        interfaces) and exits to be restarted: a test module running longer lost its HA."""
        result = self.ws_call({"type": "http/config/promote"})
        assert result.get("success"), f"http/config/promote: {result}"

    def ws_call(self, message: Dict[str, Any]) -> Dict[str, Any]:
        """One command over HA's websocket API: its result message."""
        ws = self.websocket()
        try:
            ws.send(json.dumps({"id": 1, **message}))
            while True:
                reply = json.loads(ws.recv())
                if reply.get("type") == "result":
                    return reply
        finally:
            ws.close()

    def request(self, method: str, path: str, body: Any = None, auth: bool = True,
                timeout: float = 60) -> Tuple[int, Any]:
        """(HTTP status, decoded JSON body, or the text of a body that is not JSON) of one
        REST call."""
        headers = {"Content-Type": "application/json"}
        if auth and self.token:
            headers["Authorization"] = "Bearer " + self.token
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                text = resp.read().decode()
                if "json" not in resp.headers.get("Content-Type", ""):
                    return resp.status, text     # /api/template answers text/plain
                return resp.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, text

    # ---- what the tests do through the API ----
    def config_flow(self, user_input: Dict[str, Any]) -> Dict[str, Any]:
        """Start the hivemind_chat config flow and submit its form once: the flow's result
        (a form with errors, create_entry, abort)."""
        status, flow = self.request("POST", "/api/config/config_entries/flow",
                                    {"handler": "hivemind_chat",
                                     "show_advanced_options": False})
        if status != 200 or flow.get("type") != "form":
            raise AssertionError(f"the flow did not start: {status} {flow}")
        status, result = self.request("POST", f"/api/config/config_entries/flow/"
                                              f"{flow['flow_id']}", user_input)
        if status != 200:
            raise AssertionError(f"the flow's step failed: {status} {result}")
        return result

    def conversation_entity(self, entry_id: str, timeout: float = 30) -> str:
        """The entity id of the conversation entity of config entry `entry_id` (from the
        entity registry, once it is there)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, found = self.request("POST", "/api/template", {
                "template": "{{ integration_entities('hivemind_chat') | join(',') }}"})
            names = [n for n in str(found).split(",") if n.startswith("conversation.")] \
                if status == 200 else []
            for name in names:
                status, entry = self.request("POST", "/api/template", {
                    "template": f"{{{{ config_entry_id('{name}') }}}}"})
                if status == 200 and str(entry).strip() == entry_id:
                    return name
            time.sleep(0.2)
        status, entries = self.request("GET", "/api/config/config_entries/entry")
        states = [(e.get("domain"), e.get("entry_id"), e.get("state"), e.get("reason"))
                  for e in entries if e.get("domain") == "hivemind_chat"] \
            if status == 200 and isinstance(entries, list) else (status, entries)
        raise AssertionError(f"no conversation entity appeared in {timeout} s; "
                             f"hivemind_chat's entries: {states}:\n"
                             f"{self.logs_about('hivemind_chat')[-6000:]}")

    def say(self, agent_id: str, text: str, conversation_id: Optional[str] = None,
            language: str = "en", timeout: float = 60,
            device_id: Optional[str] = None) -> Dict[str, Any]:
        """POST /api/conversation/process: HA's answer (response, conversation_id,
        continue_conversation)."""
        body = {"text": text, "agent_id": agent_id, "language": language}
        if conversation_id is not None:
            body["conversation_id"] = conversation_id
        if device_id is not None:
            body["device_id"] = device_id
        status, answer = self.request("POST", "/api/conversation/process", body,
                                      timeout=timeout)
        if status != 200:
            raise AssertionError(f"conversation/process: {status} {answer}")
        return answer

    def set_options(self, entry_id: str, options: Dict[str, Any]) -> Dict[str, Any]:
        """The entry's options flow, submitted once with `options` (the entry reloads)."""
        status, flow = self.request("POST", "/api/config/config_entries/options/flow",
                                    {"handler": entry_id})
        assert status == 200 and flow.get("type") == "form", (status, flow)
        status, result = self.request(
            "POST", f"/api/config/config_entries/options/flow/{flow['flow_id']}", options)
        assert status == 200 and result.get("type") == "create_entry", (status, result)
        return result

    def assist_run(self, text: str, pipeline_id: str, conversation_id: str,
                   timeout: float = 60) -> List[Tuple[float, Dict[str, Any]]]:
        """Run an Assist pipeline from its intent stage over HA's websocket API, as a text
        satellite does: every event of the run (intent-progress carries each chat-log
        delta) with the time.monotonic() it arrived, until run-end."""
        ws = self.websocket()
        try:
            _start_text_run(ws, text, pipeline_id, conversation_id)
            events = []
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                message = json.loads(ws.recv())
                if message.get("type") == "result" and not message.get("success"):
                    raise AssertionError(f"assist_pipeline/run: {message}")
                if message.get("type") == "event":
                    events.append((time.monotonic(), message["event"]))
                    if message["event"]["type"] == "run-end":
                        return events
            raise AssertionError(f"the run did not end in {timeout} s: {events}")
        finally:
            ws.close()

    def assist_run_cancelled(self, text: str, pipeline_id: str, conversation_id: str,
                             after_deltas: int = 2, timeout: float = 60) -> float:
        """Run an Assist pipeline (intent stage) and, once `after_deltas` chat-log deltas
        arrived, unsubscribe from it as a websocket client that gives up does (HA cancels the
        run's task: assist_pipeline/websocket_api.py). The time.monotonic() of the cancel."""
        ws = self.websocket()
        try:
            _start_text_run(ws, text, pipeline_id, conversation_id)
            deltas, deadline = 0, time.monotonic() + timeout
            while time.monotonic() < deadline:
                message = json.loads(ws.recv())
                event = message.get("event") or {}
                if event.get("type") == "run-end":
                    raise AssertionError("the run ended before it was cancelled")
                if event.get("type") == "intent-progress" and \
                        (event["data"].get("chat_log_delta") or {}).get("content"):
                    deltas += 1
                    if deltas >= after_deltas:
                        cancelled = time.monotonic()
                        ws.send(json.dumps({"id": 2, "type": "unsubscribe_events",
                                            "subscription": 1}))
                        return cancelled
            raise AssertionError(f"{after_deltas} deltas did not come in {timeout} s")
        finally:
            ws.close()

    def listen(self, event_type: str) -> "EventListener":
        """Subscribe to `event_type` on HA's bus (websocket subscribe_events), as an
        automation's event trigger listens: the events come into the listener's list."""
        return EventListener(self.websocket(), event_type)

    def create_pipeline(self, agent_id: str) -> str:
        """An Assist pipeline (text only) whose conversation agent is `agent_id`: its id."""
        result = self.ws_call({"type": "assist_pipeline/pipeline/create",
                               "conversation_engine": agent_id, "conversation_language": "en",
                               "language": "en", "name": f"hub {agent_id}",
                               "stt_engine": None, "stt_language": None, "tts_engine": None,
                               "tts_language": None, "tts_voice": None,
                               "wake_word_entity": None, "wake_word_id": None})
        assert result.get("success"), result
        return result["result"]["id"]

    def flows_in_progress(self) -> List[Dict[str, Any]]:
        """config_entries/flow/progress: the config flows in progress (reauth among them)."""
        result = self.ws_call({"type": "config_entries/flow/progress"})
        assert result.get("success"), result
        return result["result"]

    def websocket(self):
        """An authenticated connection to HA's websocket API (websocket-client)."""
        import websocket
        ws = websocket.create_connection(f"ws://127.0.0.1:{self.port}/api/websocket",
                                         timeout=60)
        assert json.loads(ws.recv())["type"] == "auth_required"
        ws.send(json.dumps({"type": "auth", "access_token": self.token}))
        reply = json.loads(ws.recv())
        assert reply["type"] == "auth_ok", reply
        return ws

    def logs(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def logs_about(self, name: str) -> str:
        """The log's records that mention `name` (each with its continuation lines), and
        HA's own setup records: what a failure message needs, without other integrations'
        tracebacks."""
        kept, keep = [], False
        for line in self.logs().splitlines():
            if line[:4].isdigit():     # a record's first line starts with its date
                keep = name in line or "homeassistant.setup" in line or \
                    "homeassistant.bootstrap" in line
            if keep:
                kept.append(line)
        return "\n".join(kept)

    def wait_running(self, timeout: float = 60) -> bool:
        """Until HA's core state is RUNNING (its start finished), as far as its API says:
        HA's API answers while integrations are still starting, and a SIGTERM then kills it
        without its final write (exit -15, a config entry made a second before gone after the
        restart). False without a token (before onboarding) or at the timeout."""
        deadline = time.monotonic() + timeout
        while self.token and time.monotonic() < deadline:
            status, config = self.request("GET", "/api/config", timeout=10)
            if status == 200 and isinstance(config, dict) and config.get("state") == "RUNNING":
                return True
            time.sleep(0.2)
        return False

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM once HA has started (wait_running), so that it writes what it holds as an
        operator's restart would; killed if it has not exited after `timeout`."""
        if self.proc is not None and self.proc.poll() is None:
            self.wait_running()
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


class EventListener:
    """The events of one type, read on a thread of their own off a websocket subscription;
    close() ends it."""

    def __init__(self, ws, event_type: str):
        import threading
        self.ws, self.events = ws, []    # each event's dict (event_type, data, ...)
        ws.send(json.dumps({"id": 1, "type": "subscribe_events", "event_type": event_type}))
        reply = json.loads(ws.recv())
        assert reply.get("success"), reply
        ws.settimeout(None)       # events may be minutes apart
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                message = json.loads(self.ws.recv())
                if message.get("type") == "event":
                    self.events.append(message["event"])
        except Exception:    # closed
            return

    def close(self) -> None:
        self.ws.close()
        self.thread.join(10)


def speech(answer: Dict[str, Any]) -> str:
    """The plain speech of a conversation/process answer."""
    return answer["response"]["speech"]["plain"]["speech"]


def _start_text_run(ws, text: str, pipeline_id: str, conversation_id: str) -> None:
    """Start an Assist pipeline run from its intent stage (request id 1), as a text satellite
    does; its events then come on `ws`."""
    ws.send(json.dumps({"id": 1, "type": "assist_pipeline/run", "start_stage": "intent",
                        "end_stage": "intent", "input": {"text": text},
                        "pipeline": pipeline_id, "conversation_id": conversation_id}))
