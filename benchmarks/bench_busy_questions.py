"""A skill's question answered at once while other sessions keep a genuine ovos-core busy, on
the stable line (ovos-core 2.1.1 and real skills behind hivemind-core 4.0.0: tests/ovos_hub.py),
through the stock hivemind-ovos-agent-plugin 0.1.0 and through our plugin's OVOS mode.

    python benchmarks/bench_busy_questions.py [--questions 60] [--bystanders 4]
                                              [--plugins stock,ovos-mode] [--generation 4.0]

Per plugin, one hub: `--bystanders` sessions say unmatched sentences without pause (the
unknown fallback: the whole pipeline runs for each), while one more session asks the alerts
skill for an alarm ("set an alarm", a get_response() question) and answers "in five hours" the
moment the question ends, `--questions` times. Counted: answers that set the alarm, and the
rest by kind (an empty answer, a timeout, another sentence); and the hub log's lines of the
stock plugin's race (tornado's iostream AssertionError from writing off the IO loop).
Target: the OVOS mode loses none; the stock plugin's count is its baseline.
"""
import argparse
import os
import sys
import threading
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from ovos_hub import OVOSHub, timed, warm_up  # noqa: E402
from ovos_utils.log import LOG  # noqa: E402
from stock_hub import STOCK_PLUGIN_RACES  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402

LOG.set_level("ERROR")


def keep_busy(agent, session_id, stop):
    """Unmatched sentences one after another until `stop` (each runs the whole pipeline)."""
    i = 0
    while not stop.is_set():
        try:
            agent.get_response(f"tell me about the purple elephant number {i}",
                               session_id=session_id)
        except Exception:
            pass          # a bystander's lost turn is not what is counted
        i += 1


def ask_and_answer(agent, session_id):
    """What came of one question answered at once: "ok", "empty", an error's name, or the
    start of another answer."""
    try:
        question, _ = timed(agent, "set an alarm", session_id)
        if "time" not in question.lower():
            return f"question: {question[:40]}"
        answer, _ = timed(agent, "in five hours", session_id)
    except Exception as e:
        return type(e).__name__
    if "alarm is set for" in answer.lower():
        return "ok"
    return "empty" if not answer else answer[:40]


def measure(plugin, generation, questions, bystanders):
    hub = OVOSHub(generation=generation, agent=plugin).start()
    stop = threading.Event()
    others = agent = None
    try:
        creds = hub.add_client()
        warm_up(creds)
        offset = hub.log_size("hivemind")
        others = HiveMindChatAgent(creds.agent_config(timeout=30))
        for k in range(bystanders):
            threading.Thread(target=keep_busy, args=(others, f"bystander-{k}", stop),
                             daemon=True).start()
        time.sleep(2)
        agent = HiveMindChatAgent(creds.agent_config(timeout=20))
        outcomes = Counter(ask_and_answer(agent, f"asker-{i}") for i in range(questions))
        log = hub.log_since("hivemind", offset)
        races = sum(log.count(race) for race in STOCK_PLUGIN_RACES)
        return outcomes, races
    finally:
        stop.set()
        for a in (agent, others):
            if a is not None:
                a.shutdown()
        hub.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=60)
    ap.add_argument("--bystanders", type=int, default=4)
    ap.add_argument("--plugins", default="stock,ovos-mode")
    ap.add_argument("--generation", default="4.0", choices=("4.0", "5"))
    args = ap.parse_args()
    print(f"{args.questions} questions answered at once, {args.bystanders} busy sessions, "
          f"hivemind-core {args.generation}\n", flush=True)
    for plugin in [p for p in args.plugins.split(",") if p]:
        outcomes, races = measure(plugin, args.generation, args.questions, args.bystanders)
        lost = args.questions - outcomes["ok"]
        rest = ", ".join(f"{kind}: {n}" for kind, n in outcomes.items() if kind != "ok")
        print(f"{plugin:<10} {lost} of {args.questions} lost{f' ({rest})' if rest else ''}; "
              f"race lines in the hub log: {races}", flush=True)


if __name__ == "__main__":
    main()
