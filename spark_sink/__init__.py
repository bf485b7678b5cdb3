"""Spark source and sink for watermarked Pulsar topics."""
