"""A satellite in its own process (its own SessionManager): asks each utterance in turn.

    python tests/satellite_process.py CONFIG_JSON SESSION_ID UTTERANCE...   -> JSON list of answers
"""
import json
import sys

from hivemind_chat_agent import HiveMindChatAgent


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
