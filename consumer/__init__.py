"""Consumers that hide markers and hand watermarks to listeners."""
