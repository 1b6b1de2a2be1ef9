"""The `llmgw` command: one module per verb group, registered on the group in `main`."""
