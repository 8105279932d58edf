"""The decision log: every verdict the gateway answers and every human label, for an auditor.

``rows`` turns a request's results into :class:`contracts.decisions.DecisionRow` rows; ``log`` keeps them (a
Redis stream shared by every replica, or this process's memory) and moves those past their age into daily
Parquet files (:mod:`contracts.decisions`), which ``modgate decisions export`` reads with the stream.
"""
