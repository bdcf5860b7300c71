"""Operations: database-derived gauges, the operator's CLI (stats, failed, retry, compact, check).

All SQL of this package lives in ``outbox.ops.queries``.
"""
