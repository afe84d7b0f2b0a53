"""The `trtflow` command: the only place that reads arguments, prints, and maps errors to exit codes.

commands: the pipeline's commands and `main`; tools: export, keys, toolchain, doctor, cache; fleet: publish channels,
rollout, agent, fleet status; output: summaries, manifests and the progress views.
Nothing outside this package imports it.
"""

from trtflow.cli import (
    fleet,  # noqa: F401,E402  (adds the rollout, agent and fleet commands to `cli`)
    tools,  # noqa: F401,E402  (adds export, keygen, toolchain, doctor and cache to `cli`)
)
from trtflow.cli.commands import cli, main  # noqa: F401
