"""A keyframe's verdict: wire models, the moderation service, verdict reuse, remote images, shadow pairs."""
