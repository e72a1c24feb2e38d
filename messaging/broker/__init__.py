"""The state machine: commands applied in order to topics, the catalog of named
streams and producers, subscriber positions, the state journal, snapshots, metrics."""
