"""`python -m llmgw.cli` runs the `llmgw` command (tests use it to run the CLI of this interpreter)."""

from llmgw.cli.main import main

main()
