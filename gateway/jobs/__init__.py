"""Keyframe batches as jobs: accepted at once (202 and an id), worked in the background, never lost.

With Redis (``MODGATE_REDIS__URL``) jobs are durable:

- a job is a hash ``modgate:job:<id>`` (status, request, result, webhook state). Submitting writes it, the
  tenant's idempotency key and an entry on the stream ``modgate:jobs`` in one Lua script: per idempotency
  key a job exists exactly once, or not at all;
- every gateway reads the stream as one consumer group, so each entry goes to one gateway and stays
  *pending* until that gateway acknowledges it. A pending entry idle longer than ``claim_idle_s`` (its
  gateway was killed) is taken over with XAUTOCLAIM by whichever gateway asks next, the restarted one or
  another replica. A gateway working a job keeps its entry fresh (XCLAIM to itself), so a long job is not
  taken from a live gateway;
- completing is one Lua script that stores the result only if the job is not finished yet: however many
  times a job is worked (a takeover racing a slow gateway), it completes once;
- the webhook goes out after completion, signed (``X-Modgate-Signature: t=<unix>,v1=<hex HMAC-SHA256 of
  "<t>." + body>``) and retried with back-off. Delivery is at least once: a gateway killed after the
  receiver answered but before the delivery was recorded sends it again, with the same
  ``X-Modgate-Delivery`` id (the job id) and the same body, so the receiver can drop the repeat.

Without Redis the same API and worker run on a dict and a queue, and jobs are NOT durable: a restart loses
every queued and running job. The gateway says so at start, and every job says ``"durable": false``.

A video job's video waits as a file in the spool (``MODGATE_VIDEOS__SPOOL_DIR``, shared by the replicas),
the job holding its reference only; once cut, its shaped frames wait beside the job (``…:cut``) and the
file goes.

The package, by job: ``models`` (the wire models and the stored record), ``store`` (the contract a job store
keeps), ``store_memory`` and ``store_redis`` (the two stores), ``webhooks`` (signing and delivery),
``worker`` (the loops that work jobs), ``service`` (what the routes call; it owns the worker), ``video``
(video jobs: the probe, the cut once, the frames judged) and ``spool`` (where a video waits until it is cut).
"""
