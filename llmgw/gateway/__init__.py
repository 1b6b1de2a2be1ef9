"""llmgw.gateway (see DESIGN.md)."""
