from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hs

from control_plane.core.checkpoint_gc import CheckpointInfo, GCPolicy, checkpoints_to_delete


def ck(uuid: str, trial: int, steps: int, metric: float | None) -> CheckpointInfo:
    return CheckpointInfo(uuid, trial, steps, float(steps), metric)


CKPTS = [ck("a1", 1, 100, 0.9), ck("a2", 1, 200, 0.5), ck("a3", 1, 300, 0.7),
         ck("b1", 2, 100, 0.4), ck("b2", 2, 200, 0.6), ck("b3", 2, 300, None)]


def test_default_policy_keeps_trial_best_and_latest() -> None:
    assert checkpoints_to_delete(CKPTS, GCPolicy()) == {"a1", "b2"}


def test_experiment_best_and_larger_is_better() -> None:
    keep_all_best = GCPolicy(save_experiment_best=2, save_trial_best=0, save_trial_latest=0)
    assert checkpoints_to_delete(CKPTS, keep_all_best) == {"a1", "a3", "b2", "b3"}
    bigger = GCPolicy(save_experiment_best=1, save_trial_best=0, save_trial_latest=0, smaller_is_better=False)
    assert checkpoints_to_delete(CKPTS, bigger) == {c.uuid for c in CKPTS} - {"a1"}


def test_protected_never_deleted() -> None:
    nothing = GCPolicy(save_experiment_best=0, save_trial_best=0, save_trial_latest=0)
    assert checkpoints_to_delete(CKPTS, nothing, protected={"a1", "b3"}) == {"a2", "a3", "b1", "b2"}


@settings(max_examples=150, deadline=None)
@given(
    rows=hs.lists(hs.tuples(hs.integers(1, 4), hs.integers(0, 50), hs.one_of(hs.none(), hs.floats(0, 10))),
                  max_size=40, unique_by=lambda r: (r[0], r[1])),
    eb=hs.integers(0, 3), tb=hs.integers(0, 3), tl=hs.integers(0, 3), smaller=hs.booleans(),
)
def test_matches_a_brute_force_reading_of_the_rules(rows, eb, tb, tl, smaller) -> None:  # type: ignore[no-untyped-def]
    ckpts = [ck(f"t{t}s{s}", t, s, m) for t, s, m in rows]
    policy = GCPolicy(eb, tb, tl, smaller)
    doomed = checkpoints_to_delete(ckpts, policy)

    def rank_key(c: CheckpointInfo) -> tuple:
        return ((c.metric if smaller else -c.metric), -c.steps_completed, c.uuid)

    for c in ckpts:
        same_trial = [o for o in ckpts if o.trial_id == c.trial_id]
        scored_exp = sorted([o for o in ckpts if o.metric is not None], key=rank_key)
        scored_trial = sorted([o for o in same_trial if o.metric is not None], key=rank_key)
        latest = sorted(same_trial, key=lambda o: (o.steps_completed, o.order, o.uuid), reverse=True)
        kept = (c in scored_exp[:eb]) or (c in scored_trial[:tb]) or (c in latest[:tl])
        assert (c.uuid not in doomed) == kept
