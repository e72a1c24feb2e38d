"""Durable Streams benchmark: /v1/stream against the native API and the reference server."""
