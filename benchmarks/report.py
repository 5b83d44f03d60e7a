"""The table the benchmark scripts print: one row per measure, beside its same-run baseline."""


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
