"""What the summaries' thread costs a training loop while it buckets histograms (not a
test: run it by hand).

    .venv/bin/python bench/bucketing_bench.py [--rounds 11] [--seconds 1.0]

A GPU host's training loop is bound by its own launches when steps are short (a 2-tower
`cnn` step of 3.8 ms on an H200): the loop's thread needs the GIL between every call it
makes into TensorFlow. The summaries' thread buckets a histogram call's tensors meanwhile,
on another core. How often that thread takes the GIL, and for how long, is what it costs
the loop, not the core time it burns.

This bench stands in for that host on this one: a small `tf.function` step on one
TensorFlow thread (the other core free, as a GPU host's cores are), called in a loop with
a worker loop's Python around it, while a background thread buckets the `cnn`'s weights
and gradients (its real variable shapes, 3.2M values a call) over and over with:

- `histogram_buckets`, the summaries' own (`trainer/summaries.py`);
- `np.histogram`, what it used before, tensor by tensor;
- a control: `np.sort` of the same tensors along their last axis, one call each that
  releases the GIL for its whole run, so the loop sees a busy core and little else.

Each round runs the loop for `--seconds` beside each of them, in rotating order; the
loop's steps/s are reported relative to the control's in the same round (a busy core
changes the loop's speed by itself on this machine, +10-20%: the control takes that out),
median over rounds with a 95% interval. Also each one's time for a call alone, and its
calls a second while the loop runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=11, help="rounds; each runs every bucketing")
    p.add_argument("--seconds", type=float, default=1.0, help="loop time beside each, a round")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    import numpy as np
    import tensorflow as tf
    from towers_bench import median_interval

    from trainer.models import build_model
    from trainer.spec import ModelSpec
    from trainer.summaries import histogram_buckets

    # One thread each: the step keeps to one core, and the other is the summaries' thread's.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng = np.random.default_rng(0)
    cnn = build_model(ModelSpec(name="cnn"), (28, 28, 1), 10).model
    # A histogram call of the `cnn`: its weights and its gradients, as float32 on the host.
    tensors = [
        rng.standard_normal(var.shape).astype(np.float32)
        for _ in ("weights", "gradients")
        for var in cnn.trainable_variables
    ]

    model = tf.keras.Sequential(
        [tf.keras.Input((32,)), tf.keras.layers.Dense(32), tf.keras.layers.Dense(10)]
    )
    optimizer = tf.keras.optimizers.SGD(0.01)
    x = tf.constant(rng.random((16, 32), dtype=np.float32))
    y = tf.constant(rng.integers(0, 10, 16).astype(np.int32))

    @tf.function
    def train(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = model(x)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    step = train.get_concrete_function(x, y)

    def loop(seconds: float) -> float:
        """Steps a second, each with a worker loop's bookkeeping: a dict, a read back."""
        done, end = 0, time.perf_counter() + seconds
        launched: list[dict[str, object]] = []
        while time.perf_counter() < end:
            done += 1
            launched.append({"step": done, "loss": step(x, y), "examples": int(x.shape[0])})
            if len(launched) == 10:  # the controller reads ten losses in one copy
                tf.stack([each["loss"] for each in launched]).numpy()
                launched.clear()
        return done / seconds

    bucketings: dict[str, Callable[[np.ndarray], object]] = {
        "control (np.sort)": np.sort,
        "np.histogram": lambda t: np.histogram(t.astype(np.float64).ravel(), bins=30),
        "histogram_buckets": histogram_buckets,
    }

    def beside(bucket: Callable[[np.ndarray], object]) -> tuple[float, float]:
        """(the loop's steps/s, the thread's bucketing calls/s) with `bucket` running."""
        stop, calls = threading.Event(), [0]

        def work() -> None:
            while not stop.is_set():
                for tensor in tensors:
                    bucket(tensor)
                calls[0] += 1

        thread = threading.Thread(target=work)
        thread.start()
        began = time.perf_counter()
        rate = loop(args.seconds)
        stop.set()
        thread.join()
        return rate, calls[0] / (time.perf_counter() - began)

    for _ in range(300):
        step(x, y)
    alone_ms = {}
    for name, bucket in bucketings.items():
        best = float("inf")
        for _ in range(5):
            began = time.perf_counter()
            for tensor in tensors:
                bucket(tensor)
            best = min(best, time.perf_counter() - began)
        alone_ms[name] = best * 1000

    names = list(bucketings)
    rates: dict[str, list[float]] = {name: [] for name in names}
    calls: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            rate, per_second = beside(bucketings[name])
            rates[name].append(rate)
            calls[name].append(per_second)

    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"Python {platform.python_version()}, numpy {np.__version__}, "
        f"TensorFlow {tf.__version__}; {args.rounds} rounds of {args.seconds} s\n"
    )
    print(
        f"A histogram call of the cnn: {len(tensors)} tensors, {sum(t.size for t in tensors):,} values\n"
    )
    print("| bucketing | a call alone | calls/s beside the loop | loop steps/s | loop / control |")
    print("|---|---:|---:|---:|---|")
    control = "control (np.sort)"
    for name in names:
        ratios = [r / c for r, c in zip(rates[name], rates[control], strict=True)]
        median, low, high = median_interval(ratios)
        interval = f" [{low:.3f}, {high:.3f}]" if low is not None else ""
        print(
            f"| {name} | {alone_ms[name]:.1f} ms | {statistics.median(calls[name]):.1f} | "
            f"{statistics.median(rates[name]):.0f} | {median:.3f}{interval} |"
        )


if __name__ == "__main__":
    main()
