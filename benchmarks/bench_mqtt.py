"""A steady turn over MQTT against the same turn over the websocket, on one hub, same run.

    python benchmarks/bench_mqtt.py [--rounds 40]

The hub is tests/mqtt_hub.py's: hivemind-core 5.3.10a1 with hivemind-mqtt-protocol 0.2.5a2
beside its websocket, this checkout's hub plugin answering both with tests/engines.py's
ScriptEngine, Debian's mosquitto on 127.0.0.1. Two agents, one per transport (each its own
access key: one MQTT session per key), warmed up, then turns of one session each, interleaved;
medians. Target (issue 28): MQTT <= 1.2x websocket + 2 ms.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, HERE)

from mqtt_hub import MqttHub  # noqa: E402
from report import Table, ms  # noqa: E402
from servers import MosquittoServer  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402


def turn(agent, session_id, text) -> float:
    started = time.monotonic()
    answer = agent.get_response(text, session_id=session_id)
    if answer != f"you said {text}":
        raise RuntimeError(f"wrong answer: {answer!r}")
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="bench-mqtt-")
    broker = MosquittoServer(os.path.join(home, "mosquitto")).start()
    hub = MqttHub(broker).start()
    agents = []
    try:
        ws = HiveMindChatAgent(hub.hub.add_client().agent_config(
            noise_key_dir=os.path.join(home, "ws-keys"), timeout=20))
        mqtt = HiveMindChatAgent(hub.client(noise_key_dir=os.path.join(home, "mqtt-keys"),
                                            timeout=20))
        agents += [ws, mqtt]
        for agent in agents:
            for k in range(5):
                turn(agent, "steady", f"warm up {k}")
        times = {"ws": [], "mqtt": []}
        for k in range(args.rounds):
            times["ws"].append(turn(ws, "steady", f"echo {k}"))
            times["mqtt"].append(turn(mqtt, "steady", f"echo {k}"))
        w, m = statistics.median(times["ws"]), statistics.median(times["mqtt"])
        table = Table()
        table.header()
        ok = table.row("steady turn over MQTT (median)", ms(m), f"websocket {ms(w)}",
                       "<= 1.2x + 2 ms", m <= 1.2 * w + 0.002)
        print(f"  p90: MQTT {ms(sorted(times['mqtt'])[int(args.rounds * 0.9)])}, websocket "
              f"{ms(sorted(times['ws'])[int(args.rounds * 0.9)])}; {args.rounds} rounds")
        return 0 if ok else 1
    finally:
        for agent in agents:
            agent.shutdown()
        hub.cleanup()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
