"""`python -m trtflow.executors.worker [--warm KIND] TASK RESULT`: what a hermetic worker process runs
(executors.hermetic).

With `--warm KIND`, the process imports what stages of KIND need first, then waits for one line on stdin: the task
file is in its folder by then. Its start-up overlaps the stage before it; it still runs exactly one task. End of
input without that line: it exits 0 (the run needed no more workers).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

from trtflow.executors import run_task, warm_up
from trtflow.util.fs import read_private


def main(argv: list[str]) -> int:
    """Load the pickled StageTask (written by the parent in a private 0700 folder of its own, read no-follow), run it,
    write the StageResult as JSON beside it; exit 0 unless the result could not be written."""
    if argv[:1] == ["--warm"]:
        warm_up([argv[1]])
        if not sys.stdin.readline():
            return 0
        argv = argv[2:]
    task_file, result_file = Path(argv[0]), Path(argv[1])
    task = pickle.loads(read_private(task_file.absolute(), 1 << 30))
    result = run_task(task, release=False)  # one task, then exit: nothing to free for a next one
    fd = os.open(result_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as sink:
        json.dump(result.to_json(), sink)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
