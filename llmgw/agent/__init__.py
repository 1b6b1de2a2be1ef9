"""llmgw.agent (see DESIGN.md)."""
