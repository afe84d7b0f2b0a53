"""The run engine: from a loaded project to executed stages, the lock and the packages.

`session` opens a project and runs it; `dag` makes the stage graph, `plan` resolves each node's key against the
store, `runner` executes what is stale through an executor (`jobs`, `admission`, `placing`), `frozen` and `repro`
hold a run to the lock and rebuild engines to check them, `runmemo` answers a no-op run without loading the project.
Nothing here imports the CLI; the CLI reaches the run only through `session`.
"""
