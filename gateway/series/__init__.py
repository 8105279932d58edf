"""Every Prometheus series the gateway exposes on ``GET /metrics``, declared here and nowhere else.

A room of its own on the ground floor (it imports nothing of the gateway), so every room may import it: the
engine pool, the review queue and the decision log sit below ``telemetry`` and could not reach series
declared there. tests/layout/test_series_declared_once.py fails when any other module constructs a metric,
and tests/telemetry/test_series_documented.py holds docs/telemetry.md's table to what is declared here.
Declaring is not writing; who writes what:

- a request's figures and a job's (its requests, its video's cut, how it finished) go through
  :class:`gateway.telemetry.recorder.RequestRecorder`, once each;
- every engine call is counted and timed by its engine client (gateway/engine/calls.py), which reports it to
  :meth:`GatewayMetrics.engine_call`; what a verdict call cost (slot wait, first token, tokens, unusable
  output, escalation) is counted where the moderation path makes it (gateway/moderation/);
- figures read at scrape time (the engine pool, the tenants, the recent window) are plain readings their
  owners hand in (:mod:`gateway.series.scraped`), turned into series here;
- the rooms below ``telemetry`` count their own work on what is declared here for them: the review queue on
  :class:`gateway.series.review.ReviewMetrics`, the prefix keeper and the decision log on
  :class:`gateway.series.metrics.GatewayMetrics`' ``prefix_*`` and ``decisions_unlogged``.

The modules: ``metrics`` (the gateway's registry and its request, engine, policy, prefix and job series),
``scraped`` (series computed at scrape time), ``review`` (the review queue's).
"""
