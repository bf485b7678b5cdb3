"""The watermark generator: follows subscriptions, folds markers into watermarks, publishes them."""
