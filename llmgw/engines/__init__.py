"""llmgw.engines (see DESIGN.md)."""
