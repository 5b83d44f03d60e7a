"""The table the benchmark scripts print: one row per measure, beside its same-run baseline; and
the CPU time a process spent, which a loaded machine moves far less than its latencies."""
import os


class Table:
    def __init__(self, widths=(44, 14, 34, 12)):
        self.widths = widths    # measure, value, baseline, target; the result follows

    def _line(self, *cells) -> str:
        padded = zip(cells, self.widths, strict=False)   # the result cell is not padded
        return " ".join(f"{cell:<{width}}" for cell, width in padded) + f" {cells[-1]}"

    def header(self) -> None:
        print(self._line("measure", "value", "baseline (same run)", "target", "result"))

    def row(self, name, value, baseline, target, ok) -> bool:
        print(self._line(name, value, baseline, target, "PASS" if ok else "FAIL"), flush=True)
        return ok


def ms(seconds) -> str:
    return f"{seconds * 1000:.1f} ms"


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
