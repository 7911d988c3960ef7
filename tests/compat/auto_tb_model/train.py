"""A trial written against Determined's own Core API (0.38.1) with `core.init()` unchanged: its
default TensorboardMode.AUTO, in an interpreter that has neither TensorFlow nor torch nor the
`tensorboard` package. Fits w to 3 by SGD and reports training and validation metrics."""

import determined as det
from determined import core


def main(ctx: core.Context) -> None:
    info = det.get_cluster_info()
    assert info is not None, "off cluster"
    w, steps = 0.0, 0
    for op in ctx.searcher.operations():
        while steps < op.length:
            steps += 1
            w -= 0.1 * 2 * (w - 3.0)
            ctx.train.report_training_metrics(steps_completed=steps, metrics={"loss": (w - 3.0) ** 2})
            if steps % 5 == 0 or steps == op.length:
                ctx.train.report_validation_metrics(steps_completed=steps,
                                                    metrics={"validation_loss": (w - 3.0) ** 2 + 0.1})
        op.report_completed((w - 3.0) ** 2 + 0.1)
    print(f"done at step {steps}", flush=True)


if __name__ == "__main__":
    with core.init() as ctx:
        main(ctx)
