"""Downsampling a metric series for a chart: Largest-Triangle-Three-Buckets (Steinarsson, 2013).

LTTB keeps the first and last points and, from each of `threshold - 2` equal buckets between them,
the point that makes the largest triangle with the point kept before it and the mean of the next
bucket: peaks, dips and the overall shape survive, so a chart of a million points drawn from a
thousand looks the same. Pure: points in, points out, in x order. Non-finite values are the
caller's to drop (they cannot be drawn anyway)."""

from __future__ import annotations

from collections.abc import Sequence

Point = tuple[float, float]


def lttb(points: Sequence[Point], threshold: int) -> list[Point]:
    """At most `threshold` of `points` (sorted by x), chosen by LTTB; all of them when there are
    no more than that. A threshold under 3 keeps the first and last point only."""
    n = len(points)
    if threshold >= n or n <= 2:
        return list(points)
    if threshold < 3:
        return [points[0], points[-1]]
    out: list[Point] = [points[0]]
    every = (n - 2) / (threshold - 2)  # bucket width over the points between first and last
    a = 0  # index of the point kept last
    for i in range(threshold - 2):
        # The next bucket's mean is the third corner of the triangle.
        nxt_start = int((i + 1) * every) + 1
        nxt_end = min(int((i + 2) * every) + 1, n)
        if nxt_start >= nxt_end:  # the last bucket: the last point stands for the next one
            avg_x, avg_y = points[-1]
        else:
            count = nxt_end - nxt_start
            sx = sy = 0.0
            for x, y in points[nxt_start:nxt_end]:
                sx += x
                sy += y
            avg_x, avg_y = sx / count, sy / count
        start = int(i * every) + 1
        end = int((i + 1) * every) + 1
        ax, ay = points[a]
        best_area = -1.0
        best = start
        # Twice the triangle's area; the constant factor does not change which point wins.
        dx = ax - avg_x
        dy = avg_y - ay
        for j in range(start, end):
            x, y = points[j]
            area = abs(dx * (y - ay) + dy * (x - ax))
            if area > best_area:
                best_area, best = area, j
        out.append(points[best])
        a = best
    out.append(points[-1])
    return out


def moving_average(values: Sequence[float], weight: float) -> list[float]:
    """Exponential smoothing as TensorBoard draws it (weight 0: none, towards 1: smoother), with
    the start-up bias corrected so the first points are not pulled towards zero."""
    if not 0 <= weight < 1:
        raise ValueError("weight must be in [0, 1)")
    out: list[float] = []
    last = 0.0
    debias = 1.0
    for v in values:
        last = last * weight + (1 - weight) * v
        debias *= weight
        out.append(last / (1 - debias) if debias < 1 else v)
    return out
