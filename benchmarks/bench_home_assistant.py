"""Home Assistant's native agent (custom_components/hivemind_chat) in a genuine Home Assistant
2026.11, every figure next to a baseline measured in the same run (issue 29).

    python benchmarks/bench_home_assistant.py [--rounds 50] [--generation 5|4.0]    # about 1 min

All on 127.0.0.1: a genuine hivemind-core hub (5.x by default; the OVOS-like test pipeline,
tests/hubs.py), `hass` in the cached chroot of tests/ha_runtime.py (tests/ha_process.py) with
this checkout's integration configured through its config flow, and `hivemind-chat wyoming`
as a process of its own, added to the same HA through HA's own Wyoming integration (its config
flow: host and port). Each front has a hub client of its own; rounds interleave the two ways
of each measure, alternating which goes first; two warm-up rounds are left out.

  1. First sentence: an Assist pipeline run (intent stage, HA's websocket API, as a text
     satellite runs it) of "paced 3 0.2" (three sentences, the first at once, 0.2 s apart),
     from sending assist_pipeline/run to the receipt of the first intent-progress event with
     chat-log delta content; vs `stream_sentences` of the same utterance on a
     HiveMindChatAgent of its own (send to first sentence). Both times are taken by this
     process as it receives. HA's pipeline set-up before our agent is called (the receipt of
     intent-start) is printed beside it, not subtracted. Target <= 1.1x + 10 ms.
  2. A whole turn: "hello" through POST /api/conversation/process with the integration's
     entity as agent_id, vs the same turn with the Wyoming entity (`hivemind-chat wyoming`
     behind it) as agent_id; request to response. Target <= 1.0x.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import ha_runtime  # noqa: E402
import wyoming  # noqa: E402
from ha_process import HomeAssistantProcess, _start_text_run, speech  # noqa: E402
from hubs import HubProcess, free_port, wait_listening  # noqa: E402
from ovos_utils.log import LOG  # noqa: E402
from report import Table, ms  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402

LOG.set_level("ERROR")
TABLE = Table((40, 24, 50, 18))
row = TABLE.row
CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")
PACED = "paced 3 0.2"


def stats(values):
    """(median, p90) of `values`."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def with_wyoming_library(ha):
    """HA's Wyoming integration needs the `wyoming` package (its manifest: 1.10.2), which the
    cached runtime does not install (hass runs with --skip-pip): this instance's own source
    folder, first on its PYTHONPATH, gets this venv's copy (and its metadata: HA checks the
    requirement is installed before it loads the integration)."""
    package = os.path.dirname(wyoming.__file__)
    site = os.path.dirname(package)
    metadata = f"wyoming-{version('wyoming')}.dist-info"
    for name in ("wyoming", metadata):
        shutil.copytree(os.path.join(site, name), os.path.join(ha.folder, "src", name),
                        ignore=shutil.ignore_patterns("__pycache__"))


def wyoming_front(creds, home):
    """`hivemind-chat wyoming` on a free loopback port (the password through the environment,
    its store under `home`): (process, port)."""
    port = free_port()
    env = {**os.environ, "HIVEMIND_CHAT_PASSWORD": creds.password, "HOME": home,
           "XDG_DATA_HOME": os.path.join(home, "data"),
           "XDG_CONFIG_HOME": os.path.join(home, "config")}
    proc = subprocess.Popen([CLI, "wyoming", "--uri", f"tcp://127.0.0.1:{port}",
                             "--host", creds.host, "--port", str(creds.port),
                             "--key", creds.key], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, 30, proc=proc, what="hivemind-chat wyoming")
    return proc, port


def entity_of(ha, domain, entry_id, timeout=30.0):
    """The conversation entity of config entry `entry_id` of integration `domain`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _status, names = ha.request("POST", "/api/template", {
            "template": f"{{{{ integration_entities('{domain}') | join(',') }}}}"})
        for name in str(names).split(","):
            if name.startswith("conversation."):
                _status, entry = ha.request("POST", "/api/template", {
                    "template": f"{{{{ config_entry_id('{name}') }}}}"})
                if str(entry).strip() == entry_id:
                    return name
        time.sleep(0.2)
    raise AssertionError(f"no conversation entity for the {domain} entry:\n{ha.logs()[-3000:]}")


def add_wyoming(ha, port):
    """HA's own Wyoming integration pointed at `port` (its config flow): the entity id."""
    status, flow = ha.request("POST", "/api/config/config_entries/flow",
                              {"handler": "wyoming", "show_advanced_options": False})
    assert status == 200 and flow.get("type") == "form", (status, flow)
    status, result = ha.request("POST", f"/api/config/config_entries/flow/{flow['flow_id']}",
                                {"host": "127.0.0.1", "port": port})
    assert status == 200 and result.get("type") == "create_entry", (status, result)
    return entity_of(ha, "wyoming", result["result"]["entry_id"])


def add_native(ha, creds):
    """This checkout's integration, through its config flow: the entity id."""
    result = ha.config_flow({"host": creds.host, "port": creds.port, "access_key": creds.key,
                             "password": creds.password})
    assert result["type"] == "create_entry", result
    return entity_of(ha, "hivemind_chat", result["result"]["entry_id"])


def assist_first_sentence(ws, pipeline, conversation_id):
    """One Assist run on the authenticated websocket `ws` (a connection per run, opened
    before the clock starts): seconds from sending the run to the receipt of run-start,
    intent-start and the first chat-log delta with content ("first"), and the sentences."""
    began = time.perf_counter()
    _start_text_run(ws, PACED, pipeline, conversation_id)
    marks, contents = {}, []
    while True:
        message = json.loads(ws.recv())
        if message.get("type") == "result" and not message.get("success"):
            raise AssertionError(f"assist_pipeline/run: {message}")
        event = message.get("event") or {}
        kind, data = event.get("type"), event.get("data") or {}
        if kind in ("run-start", "intent-start"):
            marks.setdefault(kind, time.perf_counter() - began)
        if kind == "intent-progress" and (data.get("chat_log_delta") or {}).get("content"):
            marks.setdefault("first", time.perf_counter() - began)
            contents.append(data["chat_log_delta"]["content"].strip())
        if kind == "run-end":
            return marks, contents


def direct_first_sentence(agent, session_id):
    """Seconds from `stream_sentences`' send (its first next()) to the first sentence; the
    rest of the turn is read to its end, as HA reads it."""
    began = time.perf_counter()
    stream = agent.stream_sentences([{"role": "user", "content": PACED}], session_id=session_id)
    first = next(stream)
    taken = time.perf_counter() - began
    rest = list(stream)
    return taken, [first, *rest]


def one_run(ha, pipeline, conversation_id="bench-first"):
    ws = ha.websocket()
    try:
        return assist_first_sentence(ws, pipeline, conversation_id)
    finally:
        ws.close()


def first_sentence(ha, agent, entity, rounds):
    pipeline = ha.create_pipeline(entity)
    own = ha.create_pipeline("conversation.home_assistant")   # HA's own agent, for its set-up
    expected = ["paced sentence 1", "paced sentence 2", "paced sentence 3"]
    runs, direct, own_runs = [], [], []
    for i in range(rounds + 2):     # the first two rounds warm both ways up
        if i % 2 == 0:              # which way goes first alternates
            marks, said = one_run(ha, pipeline)
            taken, said_direct = direct_first_sentence(agent, "bench-first")
        else:
            taken, said_direct = direct_first_sentence(agent, "bench-first")
            marks, said = one_run(ha, pipeline)
        assert said == expected and said_direct == expected, (said, said_direct)
        own_marks, _said = one_run(ha, own, "bench-own")    # it does not understand: fine
        if i >= 2:
            runs.append(marks)
            direct.append(taken)
            own_runs.append(own_marks)
    (f, f90), (d, d90) = stats([m["first"] for m in runs]), stats(direct)
    ok = row("first sentence in HA's chat log", f"{ms(f)} (p90 {ms(f90)})",
             f"stream_sentences {ms(d)} (p90 {ms(d90)}) {f / d:.2f}x", "<= 1.1x + 10 ms",
             f <= 1.1 * d + 0.010)
    steps = [("run sent -> run-start", None, "run-start"),
             ("-> intent-start (before our agent)", "run-start", "intent-start"),
             ("-> first delta", "intent-start", "first")]
    for name, since, until in steps:
        took, took90 = stats([m[until] - (m[since] if since else 0) for m in runs])
        print(f"  {name:<36} {ms(took)} (p90 {ms(took90)})")
    took, took90 = stats([m["run-start"] for m in own_runs])
    print(f"  {'run sent -> run-start, HA own agent':<36} {ms(took)} (p90 {ms(took90)}) "
          "(the same rounds, not graded)")
    return ok


def whole_turn(ha, native, wyoming_entity, rounds):
    na, wy = [], []
    for i in range(rounds + 2):
        ways = [(native, na), (wyoming_entity, wy)]
        for agent_id, times in ways if i % 2 == 0 else ways[::-1]:    # alternating
            began = time.perf_counter()
            answer = ha.say(agent_id, "hello", f"bench-turn-{agent_id}")
            taken = time.perf_counter() - began
            assert speech(answer) == "hello there", answer
            if i >= 2:
                times.append(taken)
    (n, n90), (w, w90) = stats(na), stats(wy)
    paired, paired90 = stats([a - b for a, b in zip(na, wy, strict=True)])
    ok = row("turn via conversation/process", f"{ms(n)} (p90 {ms(n90)})",
             f"hivemind-chat wyoming {ms(w)} (p90 {ms(w90)}) {n / w:.2f}x", "<= 1.0x", n <= w)
    print(f"  integration less Wyoming, round by round: median {ms(paired)} "
          f"(p90 {ms(paired90)}) (not graded)")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--generation", choices=("4.0", "5"), default="5")
    args = ap.parse_args()
    hub = HubProcess(generation=args.generation).start()
    home = tempfile.mkdtemp(prefix="bench-ha-wyoming-")
    ha = front = agent = None
    results = []
    try:
        ha = HomeAssistantProcess(ha_runtime.ensure_runtime())
        with_wyoming_library(ha)
        ha.start()
        ha.onboard()
        # every client registered before any connects: a 4.0 hub rewrites its JSON client
        # database as clients come, and a client added meanwhile can be lost from it
        clients = {name: hub.add_client(name=f"bench-{name}")
                   for name in ("wyoming", "native", "direct")}
        front, port = wyoming_front(clients["wyoming"], home)
        native = add_native(ha, clients["native"])
        wyoming_entity = add_wyoming(ha, port)
        agent = HiveMindChatAgent(clients["direct"].agent_config(timeout=30))
        print(f"hub: hivemind-core {args.generation} on 127.0.0.1; "
              f"hass started in {ha.started_in:.1f} s; "
              f"{args.rounds} rounds each, interleaved; load average {load()}\n")
        TABLE.header()
        results.append(first_sentence(ha, agent, native, args.rounds))
        results.append(whole_turn(ha, native, wyoming_entity, args.rounds))
    finally:
        if agent is not None:
            agent.shutdown()
        if front is not None:
            front.terminate()
            front.wait(30)
        if ha is not None:
            ha.cleanup()
        hub.cleanup()
        shutil.rmtree(home, ignore_errors=True)
    print(f"\nload average at the end: {load()}")
    print(f"{sum(results)}/{len(results)} targets met")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
