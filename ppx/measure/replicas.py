"""One step's records of d pipeline replicas (``parallel.data`` > 1) folded into one
pipeline's: what the report shows per rank is replica 0's pipeline (its spans, categories
and memory), while the step's extent and the loss cover every replica."""

from __future__ import annotations


def merge_replicas(records: list[dict]) -> list[dict]:
    """Records of every process (each with ``rank``, its pipeline rank, and ``replica``) ->
    one per pipeline rank: replica 0's, with ``start``/``end`` the earliest start and latest
    end of that pipeline rank over the replicas (so the step time spans them all), ``loss``
    the mean of the replicas' losses (each the mean over its share of the global batch, so
    the mean is the global batch's). Records without ``replica`` (one pipeline) come back
    unchanged."""
    if not records or "replica" not in records[0]:
        return records
    by_rank: dict[int, list[dict]] = {}
    for r in records:
        by_rank.setdefault(r["rank"], []).append(r)
    out = []
    for rank in sorted(by_rank):
        group = sorted(by_rank[rank], key=lambda r: r["replica"])
        row = {k: v for k, v in group[0].items() if k != "replica"}
        row["start"] = min(r["start"] for r in group)
        row["end"] = max(r["end"] for r in group)
        losses = [r["loss"] for r in group if r.get("loss") is not None]
        row["loss"] = sum(losses) / len(losses) if losses else None
        out.append(row)
    return out
