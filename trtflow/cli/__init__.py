"""The `trtflow` command: the only place that reads arguments, prints, and maps errors to exit codes.

app: the command group, Context and `main`; pipeline: validate, plan, run, report, inspect, schema; provisioning:
provision and publish; fleet: promote, rollback, agent, fleet status, remote gc; tools: export, keygen, toolchain,
doctor, cache; output and progress: what they print. Importing the package registers every command.
Nothing outside this package imports it.
"""

from trtflow.cli import fleet, pipeline, provisioning, tools
from trtflow.cli.app import cli, main

__all__ = ["cli", "fleet", "main", "pipeline", "provisioning", "tools"]
