"""The services below the CLI: each command parses its options, calls one function here and prints what it returns.

`running`: validate, plan, run (the no-op memo, early executors, the report) and report. `provisioning`: provision,
publish and the agent's rounds. `housekeeping`: the store's cache commands.
"""
