"""Paired verdict records, agreement statistics, the offline A/B runner and weekly reports.

Modules, lightest first (importing this package imports none of them):
`quality.records` (record types, stores, pairing), `quality.stats` (agreement statistics),
`quality.report` and `quality.charts` (the weekly report), `quality.runner` (offline runs),
`quality.cli` (`modgate quality run|report`).
"""
