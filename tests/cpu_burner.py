"""A CPU burner for load tests and benchmarks: a process that keeps one core busy.

    with cpu_burner():          # one core occupied until the block ends
        ...

The burner is a child process spinning in a loop, stopped by its PID (SIGKILL: it holds nothing)
and reaped when the block ends, whatever happened in it. It is what "a machine with a little
other work" does to a hub: the hub's threads get the other core and lose it at times, which is
where races that an idle machine never shows come out (issue 31: the stock plugin lost turns in
7 of 9 runs under one burner, none in 6 without).
"""
import contextlib
import subprocess
import sys
from typing import Iterator


@contextlib.contextmanager
def cpu_burner(cores: int = 1, nice: int = 0) -> Iterator[None]:
    niced = ["nice", "-n", str(nice)] if nice else []
    burners = [subprocess.Popen([*niced, sys.executable, "-c", "while True: pass"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
               for _ in range(cores)]
    try:
        yield
    finally:
        for proc in burners:
            proc.kill()
        for proc in burners:
            proc.wait(10)
