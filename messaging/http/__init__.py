"""The HTTP face of a broker: the application and its routes, middleware, the native
API, Durable Streams, consumers, snapshots, health, auth, limits and fan-out."""
