"""llmgw.store (see DESIGN.md)."""
