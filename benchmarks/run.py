"""Run every benchmark (``bench_*.py``) in turn, each in its own interpreter, and print its report.

python benchmarks/run.py              # all
python benchmarks/run.py startup      # only those whose name contains 'startup'
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    wanted = argv[1:]
    failures = 0
    for script in sorted(HERE.glob("bench_*.py")):
        if wanted and not any(w in script.stem for w in wanted):
            continue
        print(f"== {script.stem} ==", flush=True)
        failures += subprocess.call([sys.executable, str(script)]) != 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
