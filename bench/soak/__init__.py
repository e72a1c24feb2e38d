"""Soak test: one broker under a mixed load for minutes, checked for leaks and wrong data."""
