"""Fan-out experiment: the broker's part of the p99, and what the rests between slices trade."""
