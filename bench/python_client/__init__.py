"""Python client benchmark: Conn consumption and publish_batch throughput."""
