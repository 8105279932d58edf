"""The records both the service writes and the weekly report reads: verdict records and their stores, the
decision log's rows, the escalation rule's reasons and the weekly summary's models.

The ground floor: the shaping library, the gateway and the quality module import it; it imports nothing of the
project (the verdict's actions live here, in ``contracts.actions``, for that).
"""
