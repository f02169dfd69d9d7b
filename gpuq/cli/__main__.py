"""`python -m gpuq.cli`: the CLI, as the `gpuq` command runs it."""

from . import main

main()
