"""The `trtflow` command: the only place that reads arguments, prints, and maps errors to exit codes.

commands: the click commands and `main`; output: summaries, manifests and the progress views.
Nothing outside this package imports it.
"""

from trtflow.cli.commands import cli, main  # noqa: F401
