"""Peer benchmark: our broker against Redis, NATS JetStream, the reference server, bare aiohttp."""
