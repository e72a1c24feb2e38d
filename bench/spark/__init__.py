"""Spark source benchmark: one micro-batch from the broker beside a synthetic source."""
