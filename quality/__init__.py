"""Paired verdict records, agreement statistics, the offline A/B runner and weekly reports.

Modules, lightest first (importing this package imports none of them):
`quality.records` (record types, stores, pairing), `quality.summaries` (the weekly report's models),
`quality.stats` (agreement statistics), `quality.escalation` (the escalation threshold), the weekly
report (`quality.sections`, `quality.recommendation`, `quality.charts`, `quality.rendering`, assembled
in `quality.report`), `quality.runner` (offline runs), `quality.cli` (`modgate quality run|report`).
"""
