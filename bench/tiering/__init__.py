"""Tiering benchmark: uploads to an object store and reads back from it."""
