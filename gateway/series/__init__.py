"""Every Prometheus series the gateway exposes on ``GET /metrics``, declared here and nowhere else.

A room of its own on the ground floor (it imports nothing of the gateway), so every room may import it: the
engine pool, the review queue and the decision log sit below ``telemetry`` and could not reach series
declared there. tests/layout/test_series_declared_once.py fails when any other module constructs a metric,
and tests/telemetry/test_series_documented.py holds docs/telemetry.md's table to what is declared here.
Declaring is not writing; who writes what (tests/layout/test_series_written_in_one_place.py holds it):

- a request's figures and a job's (its requests, its video's cut, how it finished) go through
  :class:`gateway.telemetry.recorder.RequestRecorder`, once each; what the moderation path finds as it
  goes (frames judged, escalations, token predictions, shadow judgements) through its sibling
  :class:`gateway.telemetry.recorder.VerdictRecorder`;
- every engine call is counted and timed by its engine client (gateway/engine/calls.py), which reports it to
  :meth:`GatewayMetrics.engine_call`; what a call cost besides (slot wait, first token, tokens, unusable
  output, engine errors), the engines' start-up checks and failed scrapes are counted there too
  (:class:`gateway.engine.calls.CallFigures`), a Decisions request's tokens included;
- figures read at scrape time (the engine pool, the tenants, the recent window, the policy, the admission
  queue) are plain readings their owners hand in (:mod:`gateway.series.scraped`, the ``watch_*`` methods),
  turned into series here;
- the rooms below ``telemetry`` count their own work through named methods of what is declared here for
  them: the review queue on :class:`gateway.series.review.ReviewMetrics` (``queued``, ``labelled``, ...),
  the prefix keeper and the decision log on :class:`gateway.series.metrics.GatewayMetrics`
  (``prefix_strategy_chosen``, ``prefix_primed``, ``not_logged``).

The modules: ``metrics`` (the gateway's registry and its request, engine, policy, prefix and job series),
``scraped`` (series computed at scrape time), ``review`` (the review queue's).
"""
