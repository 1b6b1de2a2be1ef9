"""llmgw: run LLM engines on a fleet of machines behind one OpenAI-compatible API.

See DESIGN.md for the layers; each subpackage is one layer.
"""

__version__ = "0.1.0"
