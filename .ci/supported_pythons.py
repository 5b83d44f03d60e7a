"""Print the oldest and the newest Python interpreter on this machine that setup.py supports
(python_requires), one path a line, so .ci/run smoke-tests the quick start on both ends."""
import glob
import os
import re
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def floor():
    with open(os.path.join(HERE, "..", "setup.py")) as f:
        found = re.search(r'python_requires=">=(\d+)\.(\d+)"', f.read())
    return int(found.group(1)), int(found.group(2))


def candidates():
    yield from sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python3")))
    yield from filter(None, (shutil.which(f"python3.{minor}") for minor in range(8, 20)))
    yield shutil.which("python3")


def main():
    minimum, found = floor(), {}
    for exe in filter(None, candidates()):
        try:
            out = subprocess.run([exe, "-c", "import sys, venv; print(*sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(out) == 2 and tuple(map(int, out)) >= minimum:
            found.setdefault(tuple(map(int, out)), exe)
    if not found:
        raise SystemExit(f"no Python >= {minimum[0]}.{minimum[1]} on this machine")
    for version in sorted({min(found), max(found)}):
        print(found[version])


if __name__ == "__main__":
    main()
