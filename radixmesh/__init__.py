"""radixmesh: serving for structured LLM programs."""
