"""The harness's own ports and readiness (tests/ports.py, tests/servers.py): a CI run once gave
a Redis replica and a sentinel the same port (the kernel's bind(0) pick repeats), and the
sentinel, which could not bind it and exited, looked ready because the replica answered."""
import socket

import pytest
from ports import _ephemeral_range, free_port
from servers import RedisServer


def test_ports_are_never_handed_out_twice_nor_from_the_kernels_range():
    low, high = _ephemeral_range()
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high]


def test_a_port_something_serves_on_is_not_handed_out(monkeypatch):
    import ports
    block = ports._candidates()[:40]          # 30 of 40 ports serve, bound by someone else
    listeners = []
    try:
        for port in block:
            if len(listeners) == 30:
                break
            listener = socket.socket()
            try:
                listener.bind(("127.0.0.1", port))
            except OSError:                  # served already: just as good
                listener.close()
                continue
            listener.listen()
            listeners.append(listener)
        serving = {s.getsockname()[1] for s in listeners}
        monkeypatch.setattr(ports, "_candidates", lambda: block)
        monkeypatch.setattr(ports, "_handed_out", set())
        handed = [free_port() for _ in range(40 - len(serving) - 2)]
        assert not serving & set(handed)
        assert len(set(handed)) == len(handed)
    finally:
        for listener in listeners:
            listener.close()


@pytest.mark.hub
def test_a_redis_that_cannot_bind_its_port_is_not_taken_for_the_one_serving_there(tmp_path):
    serving = RedisServer(str(tmp_path / "serving")).start()
    try:
        second = RedisServer(str(tmp_path / "second"), port=serving.port)
        with pytest.raises(RuntimeError, match="exited"):
            second.start()
    finally:
        serving.stop()
