"""`python -m trtflow.executors.worker TASK RESULT`: what a worker process runs (executors.hermetic);
`python -m trtflow.executors.worker --serve WHERE` (hermetic) or `--serve-plain WHERE`: a server that forks one such
worker per task (executors.forking) of the stage kinds that run in WHERE (util.servers: `build-server`, ...).

A server imports what those stages need once, then reads requests on stdin: for each it forks a
child that runs the task file waiting in its folder, waits for it and answers the child's exit status as one line. A
hermetic server reads the fixed request `go` and does nothing else between forks, so every child starts from the same
memory: with address-space randomization off (the server was started that way) the builder sees the same addresses in
every child, as in fresh processes, and a fork costs milliseconds where a fresh process and its imports cost 0.35 s
of CPU. It forks once at start, before the first request, so the first task finds the server in the state every later
one does. A plain server's request may name modules to import first (`go modelopt.onnx.autocast ...`), kept for the
children after, and after `then` modules to import while that child runs (`go then modelopt.onnx.autocast ...`: what
the run's later tasks will import, on the core the child leaves idle; the child's status is answered as it ends, and
the next request read once the imports are done). End of input: the server exits 0.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import sys
import threading
import traceback
from pathlib import Path

from trtflow.executors import StageTask, import_quietly, run_task, warm_up
from trtflow.stages import kinds_running_in, stage
from trtflow.util.fs import read_private, size_or_zero
from trtflow.util.memory import keep_freed_memory, without_huge_pages
from trtflow.util.proc import die_with_parent
from trtflow.util.servers import USER_CODE_SERVER

# The task travels to the child pickled (the parent wrote it, in a 0700 folder of its own: the slot, or a private
# folder for isolated workers); the result comes back as JSON, never unpickled, through the same private folder.
TASK_FILE, RESULT_FILE = ".hermetic-task.pickle", ".hermetic-result.json"
OUTPUT_FILE = ".hermetic-output"  # what a forked child prints (stdout and stderr), read back if it dies
GO = b"go\n"  # asks a build server for a child: always these bytes, so that every fork starts alike


def main(argv: list[str]) -> int:
    """Load the pickled StageTask (written by the parent in a private 0700 folder of its own, read no-follow), run it,
    write the StageResult as JSON beside it; exit 0 unless the result could not be written."""
    if argv[:1] == ["--serve"]:
        return serve(list(kinds_running_in(argv[1])))
    if argv[:1] == ["--serve-plain"]:
        return serve_plain(list(kinds_running_in(argv[1])))
    task_file, result_file = Path(argv[0]), Path(argv[1]).absolute()
    task = pickle.loads(read_private(task_file.absolute(), 1 << 30))
    settle_huge_pages(task)
    if stage(task.kind).runs_in == USER_CODE_SERVER:
        os.chdir(task.workdir)  # user code runs in its work folder, as in a fresh process of its own: not in the slot
    result = run_task(task, release=False)  # one task, then exit: nothing to free for a next one
    fd = os.open(result_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as sink:
        json.dump(result.to_json(), sink)
    return 0


def settle_huge_pages(task: StageTask) -> None:
    """Give up transparent huge pages in this worker where its task's kind takes them only for larger inputs
    (Stage.huge_pages_above): a short-lived child's first huge pages cost more than they save on a small model."""
    above = stage(task.kind).huge_pages_above
    if above and input_bytes(task) <= above:
        without_huge_pages()


def input_bytes(task: StageTask) -> int:
    """The bytes of the task's input files (one that cannot be read counts nothing: the stage says what is wrong)."""
    return sum(size_or_zero(path) for upstream in task.inputs.values() for path in upstream.files.values())


def serve(kinds: list[str]) -> int:
    """A hermetic server's loop: imports, one fork to settle its state, then a fork per `go` until end of input."""
    warm_up(kinds)
    wait_for(fork_child(run=False))
    while os.read(0, len(GO)) == GO:
        answer_when_done(fork_child(run=True))
    return 0


def serve_plain(kinds: list[str]) -> int:
    """A plain server's loop: imports, then per request the modules it names (once), a fork, and the modules named
    after `then` while the child runs, until end of input."""
    keep_freed_memory()
    warm_up(kinds)
    for request in sys.stdin.buffer:
        words = request.decode("ascii", "replace").split()
        if words[:1] != ["go"]:
            break
        first, later = split_request(words[1:])
        import_quietly(first)
        # what the server holds (ModelOpt, torch, onnx: hundreds of MB of objects) out of every collection a child
        # makes: a child's collector would otherwise touch each object and copy its page
        gc.freeze()
        child = fork_child(run=True)
        if not later:
            answer_when_done(child)
            continue
        answer = threading.Thread(target=answer_when_done, args=(child,))
        answer.start()  # the child's status as it ends: its seconds are its own, not the imports'
        import_quietly(later)  # the child has its copy of this process already: nothing it runs changes
        answer.join()  # no thread left beside the next fork
    return 0


def answer_when_done(pid: int) -> None:
    """Wait for the child `pid` and answer its exit status as one line."""
    os.write(1, b"%d\n" % wait_for(pid))


def split_request(words: list[str]) -> tuple[list[str], list[str]]:
    """A plain server's request words: (the modules to import before forking, those to import while the child runs)."""
    if "then" not in words:
        return words, []
    at = words.index("then")
    return words[:at], words[at + 1 :]


def fork_child(run: bool) -> int:
    """Fork a child that runs the task in this folder when `run` (else exits at once); its pid."""
    pid = os.fork()
    if pid == 0:
        os._exit(_child() if run else 0)
    return pid


def wait_for(pid: int) -> int:
    """Wait for the child `pid`: its exit status, negative for the signal that killed it."""
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _child() -> int:
    """In a forked child: die with the server, print into the slot's output file (not the server's pipes), run the
    task in this folder."""
    try:
        die_with_parent()
        output = os.open(OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        return main([TASK_FILE, RESULT_FILE])
    except BaseException:  # noqa: BLE001 - whatever it was, the child must end here, never return into the loop
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
