"""Many open streams: what streaming subscribers cost the broker."""
