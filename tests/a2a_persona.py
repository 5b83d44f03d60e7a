"""An OVOS persona answered by an A2A agent, run in the a2a-persona venv (tests/hub_venvs.py),
as ovos-core's persona pipeline runs it: the genuine ovos-persona `PersonaService` loads the
persona files of a folder (ovos-a2a-solver-plugin as their handler) and answers each query
with `PersonaService.query`, sentence by sentence.

    python tests/a2a_persona.py PERSONAS_DIR TURNS_JSON OUT_PATH

TURNS_JSON: a list of [persona, session_id, utterance], asked in order in this one process
(the plugin keeps each OVOS session's contextId in memory, as it does inside ovos-core).
Writes OUT_PATH (OVOS logs to stdout): a JSON list with, for each turn, the sentences the
persona spoke, or {"error": "..."} when it raised.
"""
import json
import sys


def main(personas_dir: str, turns_json: str, out_path: str) -> int:
    from ovos_bus_client.session import Session
    from ovos_persona import PersonaService
    from ovos_utils.fakebus import FakeBus

    service = PersonaService(bus=FakeBus(), config={"personas_path": personas_dir,
                                                    "ignore_plugin_personas": True})
    results = []
    for persona, session_id, utterance in json.loads(turns_json):
        try:
            results.append(list(service.query(utterance, persona, Session(session_id))))
        except Exception as e:     # the test says which turn failed, and how
            results.append({"error": f"{type(e).__name__}: {e}"})
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
