"""A satellite in its own process (its own SessionManager): asks each utterance in turn.

    python tests/satellite_process.py CONFIG_JSON SESSION_ID UTTERANCE...   -> JSON list of answers

`run_satellite(creds, session_id, *utterances)` runs it from a test and returns the answers.
"""
import json
import os
import subprocess
import sys

from hivemind_chat_agent import HiveMindChatAgent


def run_satellite(creds, session_id, *utterances):
    """Ask from a separate process: its SessionManager is its own, as on a real device."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__),
                          json.dumps(creds.agent_config()), session_id, *utterances],
                         capture_output=True, text=True, timeout=120)
    line = [x for x in out.stdout.splitlines() if x.startswith("ANSWERS ")]
    assert line, out.stderr[-2000:]
    return json.loads(line[0][len("ANSWERS "):])


def main():
    config, session_id, utterances = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3:]
    agent = HiveMindChatAgent(config)
    try:
        answers = [agent.get_response(u, session_id=session_id) for u in utterances]
    finally:
        agent.shutdown()
    print("ANSWERS " + json.dumps(answers), flush=True)


if __name__ == "__main__":
    main()
