"""`python -m trtflow.executors.worker TASK RESULT`: what a hermetic worker process runs (executors.hermetic)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from trtflow.executors import run_task


def main(argv: list[str]) -> int:
    """Load the pickled StageTask, run it, write the pickled StageResult; exit 0 unless the result could not be written."""
    task_file, result_file = Path(argv[0]), Path(argv[1])
    result = run_task(pickle.loads(task_file.read_bytes()))
    result_file.write_bytes(pickle.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
