"""Keyframe batches submitted as jobs: stores, signed webhooks, the worker."""
