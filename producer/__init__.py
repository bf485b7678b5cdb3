"""Producers that write watermark markers into their topic."""
