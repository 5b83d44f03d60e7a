"""Run a real hivemind-core hub with the test pipeline in its own process, so tests can kill it.

    python tests/hub_process.py HOME PORT      (PORT 0 picks a free one; prints "READY <port>")
"""
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pipeline_agent import start_hub  # noqa: E402


def main():
    home, port = sys.argv[1], int(sys.argv[2])
    hub = start_hub(home=home, port=port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"READY {hub.port}", flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    hub.stop()


if __name__ == "__main__":
    main()
