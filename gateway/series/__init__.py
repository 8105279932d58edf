"""Every Prometheus series the gateway exposes on ``GET /metrics``, declared here and nowhere else.

A room of its own on the lowest floor (it imports nothing of the gateway), so every room may import it: the
engine pool, the review queue and the decision log sit below ``telemetry`` and could not reach series
declared there. A layout test (tests/layout/test_series_declared_once.py) fails when any other module
constructs a metric. Declaring is not writing; who writes what:

- a request's figures and a job's (its requests, its cut, how it finished) go through
  :class:`gateway.telemetry.recorder.RequestRecorder`, once each;
- every engine call is reported by its engine client (gateway/engine/calls.py) to
  :meth:`GatewayMetrics.engine_call`;
- figures read at scrape time (the engine pool, the tenants, the recent window) are plain readings their
  owners hand in (:mod:`gateway.series.scraped`), turned into series here;
- what the rooms below ``telemetry`` count of their own work (the review queue, the decision log, the prefix
  keeper) they write on the objects declared here for them (:mod:`gateway.series.review`,
  :mod:`gateway.series.prefix`).

The modules: ``metrics`` (the gateway's registry and its request, engine, policy and job series),
``scraped`` (series computed at scrape time), ``review`` (the review queue's and the decision log's),
``prefix`` (the prefix keeper's). docs/telemetry.md documents each series.
"""
