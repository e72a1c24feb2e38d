"""A cluster of topic groups: which node holds which group, one broker and log per group."""
