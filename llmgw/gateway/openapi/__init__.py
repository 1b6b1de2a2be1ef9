"""OpenAI's request schemas, vendored from openai-openapi (see update.py and openai-requests.json's `source`)."""
