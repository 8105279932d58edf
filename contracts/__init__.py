"""The records both the service writes and the weekly report reads: verdict records and their stores, the
decision log's rows, the escalation rule's reasons and the weekly summary's models.

The ground floor above ``shaping``: the gateway and the quality module both import it; it imports neither.
"""
