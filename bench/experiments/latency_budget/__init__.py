"""Latency budget: where the p50 of publish → subscriber at 1,000 msg/s goes."""
