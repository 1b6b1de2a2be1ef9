"""llmgw.control (see DESIGN.md)."""
