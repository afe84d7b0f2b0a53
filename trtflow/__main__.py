"""The `trtflow` command (`python -m trtflow` is the same): a cold local run's model tools' server starts first
(util.early_server), then the CLI is imported and runs."""

from __future__ import annotations

import sys
from typing import Any


def main() -> Any:
    """Start what a cold run needs first, then run the CLI on the command's arguments."""
    from trtflow.util import early_server

    early_server.start_for(sys.argv[1:])
    from trtflow.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    main()
