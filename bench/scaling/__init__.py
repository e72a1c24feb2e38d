"""Cost as work grows: throughput and p99 against batch size, message size, topics, subscribers."""
