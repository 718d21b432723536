"""The OpenAI-compatible HTTP API: request and response models, the conversion to the
router's terms, the endpoints, tool calling and the OpenAPI description."""
