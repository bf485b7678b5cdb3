"""Talking to Pulsar: settings from the environment, authentication, the admin REST client, topic names,
client errors explained. Imported by the producer, the consumer, the Spark source and sink and the generator
alike; it imports only `watermark_core` below it.
"""
