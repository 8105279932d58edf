"""Paired verdict records, agreement statistics, the offline A/B runner and weekly reports.

Modules, lightest first (importing this package imports none of them):
`contracts.records` (record types, stores, pairing), `contracts.summaries` (the weekly report's models),
`quality.stats` (agreement statistics), `quality.escalation` (the escalation threshold), the weekly
report (`quality.sections`, `quality.recommendation`, `quality.charts`, `quality.rendering`, assembled
in `quality.report`), `quality.runner` (offline runs), `cli.quality` (`modgate quality run|report`).
"""
