"""llmgw.wire (see DESIGN.md)."""
