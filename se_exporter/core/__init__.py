"""The kernel: domain values and pure logic every program shares, no I/O.

    errors.py     the one error tree (every exception class the project raises)
    model.py      Scheduled Events documents parsed into frozen values
    lifecycle.py  the pure lifecycle diff between two documents
    apiversion.py which api-version to ask for, and which event types each one lists
    spot.py       a Preempt linked to the SpotRebalanceRecommendation before it
    retry.py      the one backoff, and the health of a retried operation
"""
