"""The review queue: frames people should look at, claimed by one reviewer at a time, labelled once.

What goes in (:func:`gateway.review.selection.review_reason`): a ``review`` verdict, a verdict whose
confidence is under the review threshold, and a random audit sample of confident verdicts. Each item keeps
the shaped frame only for its life: until it is labelled, or until the retention setting passes.

Stores (one contract, :class:`gateway.review.store.ReviewStore`):

- :mod:`gateway.review.store_memory`: this process only, lost on restart (the quick-start default).
- :mod:`gateway.review.store_redis`: a Redis stream per tenant read by one consumer group, one consumer per
  reviewer. A claim is a delivery to that reviewer's consumer; it stays in the group's pending list until
  labelled, so a gateway that dies loses nothing, and a claim left longer than the claim timeout is taken
  over by the next reviewer who asks (``XAUTOCLAIM``). The frame and verdict live in a hash with the
  retention as its TTL; labelling acknowledges and deletes the entry and the hash in one Lua script, and
  leaves a small tombstone (no frame) so a second label is refused with 409.
"""
