"""Storage engine benchmark: durable appends, decoding, seeking, recovery and start-up."""
