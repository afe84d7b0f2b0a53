"""`python -m trtflow` is the same as the `trtflow` command."""

from trtflow.cli import main

main()
