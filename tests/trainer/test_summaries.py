"""Summaries as TensorBoard reads them back: the right plugin, the right values."""

import math
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.distribution.compressor import compress_histogram

from trainer.descriptions import describe
from trainer.summaries import SummaryManager, _scalar_proto, histogram_buckets, scalars_event


def read(logdir):
    acc = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    return acc


def test_histogram_buckets_count_every_value():
    values = np.random.default_rng(0).normal(size=10_000)
    buckets = histogram_buckets(values)
    assert buckets.shape == (30, 3)
    assert buckets[:, 2].sum() == 10_000
    assert buckets[0, 0] == values.min() and buckets[-1, 1] == pytest.approx(values.max())
    np.testing.assert_allclose(buckets[1:, 0], buckets[:-1, 1])


@pytest.mark.parametrize("chunk", [7, 1 << 20], ids=["in chunks of 7", "in one chunk"])
def test_histogram_buckets_are_numpys(monkeypatch, chunk):
    # The buckets and counts of np.histogram, which they replace: values on every edge
    # (integers, the edges themselves) go to the bucket the edge opens, the maximum to the
    # last; counted across chunk boundaries alike.
    monkeypatch.setattr("trainer.summaries.BUCKETING_CHUNK", chunk)
    rng = np.random.default_rng(3)
    for values in (
        rng.normal(size=1001).astype(np.float32),
        rng.integers(-15, 16, 997),
        np.linspace(-1.0, 2.0, 31),
        rng.integers(0, 256, (30, 31)).astype(np.uint8),
    ):
        counts, edges = np.histogram(values.astype(np.float64), bins=30)
        buckets = histogram_buckets(values)
        np.testing.assert_array_equal(buckets[:, 2], counts)
        np.testing.assert_array_equal(buckets[:, 0], edges[:-1])
        np.testing.assert_array_equal(buckets[:, 1], edges[1:])


@pytest.mark.parametrize(
    "values",
    [np.array([-3e38, 0.0, 3e38], np.float32), np.array([1.0, 2.5, 4.0], np.float16),
     np.array([-2, 5, 7], np.int64)],
    ids=["float32 wider than float32 can subtract", "float16", "int64"],
)  # fmt: skip
def test_histogram_buckets_of_any_numeric_dtype(values):
    buckets = histogram_buckets(values)
    assert buckets[:, 2].sum() == 3 and buckets[0, 2] == 1 and buckets[-1, 2] == 1
    assert buckets[0, 0] == float(values.min()) and buckets[-1, 1] == float(values.max())


def test_histogram_buckets_constant_tensor():
    # TensorBoard's own shape for one value: every edge at it, the count in the last bucket.
    buckets = histogram_buckets(np.full((4, 4), 3.0))
    assert buckets.shape == (30, 3)
    assert (buckets[:, :2] == 3.0).all() and buckets[-1, 2] == 16 and buckets[:, 2].sum() == 16


@pytest.mark.parametrize("value", [0.0, 3.0, -1e-6])
def test_distribution_of_a_constant_tensor_is_the_value(value):
    # What the distributions chart draws (TensorBoard's compressor): every percentile at the
    # value. Buckets [v, v + 1] drew an all-zero bias as spread from 0 to 1, median 0.017.
    for _, percentile in compress_histogram(histogram_buckets(np.full(64, value))):
        assert percentile == value


def test_histogram_buckets_count_finite_values_only():
    # A NaN or an infinity in a gradient must not fail the job (np.histogram refuses a
    # range that holds one): the histogram counts the finite values.
    buckets = histogram_buckets(np.array([1.0, np.nan, np.inf, -np.inf, 2.0, 1.5]))
    assert buckets[:, 2].sum() == 3 and buckets[0, 0] == 1.0 and buckets[-1, 1] == 2.0
    for nothing in (np.array([np.nan, np.inf]), np.zeros((0, 3))):
        assert (histogram_buckets(nothing) == 0).all()


@pytest.mark.parametrize(
    "values",
    [np.array([1.0, 1.0 + 1e-15, 1.0]), np.array([-1.7e308, 0.0, 1.7e308])],
    ids=["narrower than float64 can cut", "wider than float64 can subtract"],
)
def test_histogram_buckets_of_extreme_ranges(values):
    buckets = histogram_buckets(values)
    assert buckets[:, 2].sum() == values.size and np.isfinite(buckets).all()
    assert buckets[0, 0] == values.min() and buckets[-1, 1] == values.max()
    assert (np.diff(buckets[:, 0]) >= 0).all()


def test_histograms_with_non_finite_values_are_written_and_logged_once(tmp_path, caplog):
    summaries = SummaryManager(tmp_path)
    grad = tf.constant([np.inf, 1.0, 2.0, np.nan])
    for step in (1, 2):
        summaries.histograms("train", {"gradients/w": grad, "weights/w": np.ones(3)}, step=step)
    summaries.close()
    acc = read(tmp_path / "train")
    assert [e.step for e in acc.Tensors("gradients/w")] == [1, 2]
    assert tf.make_ndarray(acc.Tensors("gradients/w")[0].tensor_proto)[:, 2].sum() == 2
    warnings = [r.getMessage() for r in caplog.records if "gradients/w" in r.getMessage()]
    assert warnings == [
        "gradients/w holds 2 NaN or infinite values at step 1; its histogram counts the "
        "finite ones (said once)"
    ]


def test_write_scalars_and_histograms_read_back(tmp_path):
    summaries = SummaryManager(tmp_path)
    summaries.scalars("train", {"loss": 0.25, "tower_0/loss": 0.5}, step=7)
    summaries.histograms("train", {"weights/w": tf.constant([[1.0, 2.0], [3.0, 4.0]])}, step=7)
    summaries.close()
    acc = read(tmp_path / "train")
    loss = acc.Tensors("loss")[0]
    assert loss.step == 7 and tf.make_ndarray(loss.tensor_proto) == pytest.approx(0.25)
    assert acc.SummaryMetadata("tower_0/loss").plugin_data.plugin_name == "scalars"
    histogram = acc.Tensors("weights/w")[0]
    assert acc.SummaryMetadata("weights/w").plugin_data.plugin_name == "histograms"
    assert tf.make_ndarray(histogram.tensor_proto)[:, 2].sum() == 4


def test_a_zero_fraction_is_counted_from_its_histograms_values(tmp_path):
    # A rectifier's zero fraction, a scalar in the histograms' event: 3 of 8 values are
    # exactly 0 (not the -0.0 a ReLU never gives, nor a NaN, which is no 0). Values of no
    # zero fraction asked for get none.
    relu = np.array([[0.0, 1.5, 0.0, 2.0], [0.0, 0.5, np.nan, 1e-30]], np.float32)
    summaries = SummaryManager(tmp_path)
    for step in (5, 10):
        summaries.histograms(
            "train",
            {"activations/dense": relu * (step // 5), "weights/dense/kernel": np.zeros(3)},
            step=step,
            zero_fractions={"activations/dense": "zero_fraction/dense"},
        )
    summaries.close()
    acc = read(tmp_path / "train")
    assert set(acc.Tags()["tensors"]) == {
        "activations/dense", "weights/dense/kernel", "zero_fraction/dense"
    }  # fmt: skip
    fractions = acc.Tensors("zero_fraction/dense")
    assert [e.step for e in fractions] == [5, 10]
    assert [float(tf.make_ndarray(e.tensor_proto)) for e in fractions] == [3 / 8, 3 / 8]
    assert acc.SummaryMetadata("zero_fraction/dense").plugin_data.plugin_name == "scalars"
    assert acc.SummaryMetadata("zero_fraction/dense").summary_description.startswith(
        "Fraction of layer `dense`'s outputs that are exactly 0"
    )


def test_summary_manager_without_logdir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a writer given no folder would end up
    summaries = SummaryManager(None)
    summaries.scalars("train", {"loss": 1.0}, step=1)
    summaries.histograms("train", {"w": np.ones(3)}, step=1)
    summaries.images("train", {"x": np.zeros((1, 4, 4, 1), np.float32)}, step=1, max_images=1)
    summaries.close()
    assert list(tmp_path.iterdir()) == []
    assert summaries._files == {}


def raw_values(logdir):
    """(tag, step, has metadata) of every summary value in `logdir`'s event files, in order."""
    out = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                out.append((value.tag, event.step, value.HasField("metadata")))
    return out


def test_every_tag_is_described_and_read_back_whole(tmp_path):
    summaries = SummaryManager(tmp_path)
    for step in (10, 20, 30):
        summaries.scalars("train", {"loss": step / 10, "tower_1/compute_ms": 2.0}, step=step)
        summaries.histograms("train", {"gradients/dense/kernel": np.arange(4.0)}, step=step)
        summaries.scalars("eval", {"accuracy": 0.5}, step=step)
    summaries.images(
        "train", {"tower_0/inputs": np.zeros((2, 4, 4, 1), np.float32)}, step=10, max_images=2
    )
    summaries.close()
    train, evals = read(tmp_path / "train"), read(tmp_path / "eval")
    described = {
        tag: acc.SummaryMetadata(tag).summary_description
        for acc in (train, evals)
        for tag in acc.Tags()["tensors"]
    }
    assert all(described.values()), described
    assert "tower 1" in described["tower_1/compute_ms"]
    assert "`dense/kernel`" in described["gradients/dense/kernel"]
    assert "EMA" in evals.SummaryMetadata("accuracy").summary_description
    # Metadata only in a tag's first value, yet every value is read, under its plugin.
    assert [e.step for e in train.Tensors("loss")] == [10, 20, 30]
    assert [tf.make_ndarray(e.tensor_proto) for e in train.Tensors("loss")] == [1.0, 2.0, 3.0]
    assert [e.step for e in train.Tensors("gradients/dense/kernel")] == [10, 20, 30]
    assert train.SummaryMetadata("loss").plugin_data.plugin_name == "scalars"
    assert train.SummaryMetadata("gradients/dense/kernel").plugin_data.plugin_name == ("histograms")


def test_metadata_is_written_once_a_tag_per_event_file(tmp_path):
    # TensorBoard keeps a tag's first metadata; repeating it (with its description) in
    # every value would triple the scalars' share of the event file.
    summaries = SummaryManager(tmp_path)
    for step in (1, 2, 3):
        summaries.scalars("train", {"loss": 1.0, "accuracy": 0.5}, step=step)
        summaries.histograms("train", {"weights/w": np.ones(3)}, step=step)
    summaries.close()
    # A resumed job writes a new event file: its first values carry the metadata again.
    summaries.scalars("train", {"loss": 1.0}, step=4)
    summaries.close()
    with_metadata = [(tag, step) for tag, step, has in raw_values(tmp_path / "train") if has]
    assert with_metadata == [("loss", 1), ("accuracy", 1), ("weights/w", 1), ("loss", 4)]


def proto_built_scalars(step, wall_time, values):
    """The `Event` of `values` as protobuf messages build it (what `scalars_event` encodes)."""
    summary = Summary()
    for tag, value in values.items():
        summary.value.add(tag=tag).tensor.CopyFrom(_scalar_proto(float(value)))
    return event_pb2.Event(step=step, wall_time=wall_time, summary=summary).SerializeToString()


@pytest.mark.parametrize(
    "step",
    [0, 1, 127, 128, 16_384, 2**40, 2**63 - 1, -1, -(2**63), np.int64(2**40), np.int32(-7)],
)
@pytest.mark.parametrize("wall_time", [0.0, 1795819389.789851])
def test_scalars_event_is_the_bytes_protobuf_makes(step, wall_time):
    # Tags of one and two length bytes, non-ASCII ones, and values protobuf stores as it
    # does: NaN, infinities, -0.0, a subnormal rounding to 0, float32's largest, and
    # float64 values past it, which protobuf makes an infinity (and `struct` refuses).
    values = {
        "loss": 0.25, "tower_0/loss": math.nan, "é/ü": -math.inf, "x" * 200: 1e39,
        "neg": -1e39, "tiny": 1e-46, "zero": -0.0, "max": 3.4028235e38,
    }  # fmt: skip
    for some in (values, {}, {"accuracy": 1.0}):
        assert scalars_event(step, wall_time, some) == proto_built_scalars(step, wall_time, some)


def test_scalars_after_a_files_first_are_read_back_as_written(tmp_path):
    # Every scalars call after a tag's first in a file is encoded by `scalars_event`.
    summaries = SummaryManager(tmp_path)
    summaries.scalars("train", {"loss": 1.0}, step=1)
    summaries.scalars("train", {"loss": 0.5, "tower_1/loss": 2.0}, step=2)  # a new tag: messages
    summaries.scalars("train", {"loss": 0.25, "tower_1/loss": 4.0}, step=3)  # encoded
    summaries.close()
    acc = read(tmp_path / "train")
    assert [(e.step, tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors("loss")] == [
        (1, 1.0), (2, 0.5), (3, 0.25),
    ]  # fmt: skip
    assert [(e.step, tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors("tower_1/loss")] == [
        (2, 2.0), (3, 4.0),
    ]  # fmt: skip
    assert acc.SummaryMetadata("tower_1/loss").plugin_data.plugin_name == "scalars"
    assert [(t, s, has) for t, s, has in raw_values(tmp_path / "train") if s == 3] == [
        ("loss", 3, False), ("tower_1/loss", 3, False),
    ]  # fmt: skip


def test_describe_knows_the_tags_a_job_writes():
    for subdir, tag in [
        ("train", "loss"),
        ("train", "accuracy"),
        ("train", "learning_rate"),
        ("train", "grad_norm"),
        ("train", "loss_scale"),
        ("train", "examples_per_sec"),
        ("train", "step_time_ms"),
        ("train", "tower_12/loss"),
        ("train", "tower_0/compute_ms"),
        ("train", "tower_1/memory_mb"),
        ("train", "tower_3/inputs"),
        ("train", "weights/block_1/conv/kernel"),
        ("train", "gradients/dense/bias"),
        ("train", "activations/stage2_block1_out"),
        ("train", "zero_fraction/stage2_block1_out"),
        ("eval", "loss"),
        ("eval", "accuracy"),
    ]:
        assert describe(subdir, tag), (subdir, tag)
    assert describe("train", "tower_12/loss").startswith("Mean loss of the examples tower 12")
    assert describe("eval", "grad_norm") == describe("train", "no such tag") == ""
    # Train and eval share a chart: each says how it was computed, so a train curve below
    # its eval one reads as dropout and augmentation, not as a fault.
    for tag in ("loss", "accuracy"):
        assert "dropout on" in describe("train", tag)
        assert "dropout off" in describe("eval", tag)


@pytest.mark.parametrize(
    ("channels", "shown"), [(1, 1), (2, 1), (3, 3), (4, 3), (5, 1)], ids=lambda v: str(v)
)
def test_images_show_what_the_tower_trained_on(tmp_path, channels, shown):
    # Values as the model saw them (clipped to [0, 1]); a fourth channel is data, not
    # alpha: as alpha, its zeros made the pixels invisible.
    batch = np.zeros((3, 4, 5, channels), np.float32)
    batch[..., 0] = 1.5  # clipped to 1
    batch[0, 0, 0, :] = -1.0  # clipped to 0
    summaries = SummaryManager(tmp_path)
    summaries.images("train", {"tower_0/inputs": batch}, step=1, max_images=2)
    summaries.close()
    [event] = read(tmp_path / "train").Tensors("tower_0/inputs")
    width, height, *pngs = tf.make_ndarray(event.tensor_proto)
    assert (int(width), int(height), len(pngs)) == (5, 4, 2)
    image = tf.io.decode_png(pngs[0]).numpy()
    assert image.shape == (4, 5, shown)
    assert image[0, 0, 0] == 0 and (image[1:, :, 0] == 255).all()
    assert (image[..., 1:] == 0).all()


class Gate:
    """Holds the summaries' background thread until opened: what the loop does meanwhile
    is what it does while a GPU host's thread buckets a large model's histograms."""

    def __init__(self, summaries):
        self.opened = threading.Event()
        summaries._make_room()
        summaries._hand_over(lambda: self.opened.wait(timeout=60), "train", Summary())

    def open(self):
        self.opened.set()


@pytest.mark.parametrize("update", ["assign_add", "fused training kernel"])
def test_a_histogram_holds_the_values_of_its_step(tmp_path, update):
    # The loop hands over the variable and goes on to the next step's update while the
    # background thread has not bucketed it yet; the histogram must still be of this step.
    summaries = SummaryManager(tmp_path)
    gate = Gate(summaries)
    weights = tf.Variable(tf.zeros(1000))
    summaries.histograms("train", {"weights/w": weights}, step=1)
    if update == "assign_add":
        weights.assign_add(tf.ones(1000))
    else:  # as trainer/updates.py applies an update
        tf.raw_ops.ResourceApplyGradientDescent(
            var=weights.handle, alpha=tf.constant(1.0), delta=-tf.ones(1000)
        )
    assert weights.numpy().min() == 1.0
    gate.open()
    summaries.close()
    [histogram] = read(tmp_path / "train").Tensors("weights/w")
    buckets = tf.make_ndarray(histogram.tensor_proto)
    assert (buckets[:, :2] == 0.0).all() and buckets[-1, 2] == 1000  # all zeros, as at step 1


def test_the_loop_waits_only_when_the_background_thread_falls_behind(tmp_path):
    summaries = SummaryManager(tmp_path)
    gate = Gate(summaries)
    # One call pending (the gate): the next is handed over and returns at once.
    summaries.histograms("train", {"weights/w": np.ones(3)}, step=1)
    # Two pending: a third waits for the oldest, so host copies cannot pile up; it takes
    # its own only once it has room (here: after the batch changed while it waited).
    batch = np.zeros((1, 4, 4, 1), np.float32)
    third = threading.Thread(
        target=summaries.images, args=("train", {"tower_0/inputs": batch}, 1, 1)
    )
    third.start()
    third.join(timeout=0.5)
    assert third.is_alive(), "a third call went on with two still pending"
    batch[:] = 1.0
    gate.open()
    third.join(timeout=60)
    assert not third.is_alive()
    summaries.close()
    acc = read(tmp_path / "train")
    assert len(acc.Tensors("weights/w")) == len(acc.Tensors("tower_0/inputs")) == 1
    [image] = acc.Tensors("tower_0/inputs")
    assert (tf.io.decode_png(tf.make_ndarray(image.tensor_proto)[2]).numpy() == 255).all()


def test_an_image_is_of_its_step_and_only_max_images_are_held(tmp_path):
    summaries = SummaryManager(tmp_path)
    gate = Gate(summaries)
    batch = np.zeros((64, 4, 4, 1), np.float32)
    before = time.time()
    summaries.images("train", {"tower_0/inputs": batch}, step=1, max_images=2)
    handed = time.time()
    batch[:] = 1.0  # the next step's batch, in the same memory, before the PNGs are made
    time.sleep(0.1)
    gate.open()
    summaries.close()
    [image] = read(tmp_path / "train").Tensors("tower_0/inputs")
    width, height, *pngs = tf.make_ndarray(image.tensor_proto)
    assert len(pngs) == 2 and (tf.io.decode_png(pngs[0]).numpy() == 0).all()
    # Stamped when handed over (the step's time), not when the thread wrote it.
    assert before <= image.wall_time <= handed


def test_a_failure_on_the_background_thread_is_raised_on_the_loop(tmp_path):
    summaries = SummaryManager(tmp_path)
    summaries.histograms("train", {"weights/w": np.array(["not a number"])}, step=1)
    with pytest.raises(ValueError, match="could not convert"):
        summaries.flush()
    # The failed call's event never reached the file: the next value carries the tag's
    # metadata, or TensorBoard could not tell which plugin draws it.
    summaries.histograms("train", {"weights/w": np.ones(3)}, step=2)
    summaries.histograms("train", {"weights/w": np.array(["not a number"])}, step=3)
    with pytest.raises(ValueError, match="could not convert"):
        summaries.close()
    acc = read(tmp_path / "train")
    assert [e.step for e in acc.Tensors("weights/w")] == [2]
    assert acc.SummaryMetadata("weights/w").plugin_data.plugin_name == "histograms"
    # Closed all the same: a new call starts a new file.
    summaries.scalars("train", {"loss": 1.0}, step=4)
    summaries.close()
    assert len(list((tmp_path / "train").glob("events.out.tfevents.*"))) == 2


def test_every_value_is_on_disk_when_its_call_returns(tmp_path):
    # No flush or close: TensorBoard, reading while the job runs, sees each value at once.
    summaries = SummaryManager(tmp_path)
    summaries.scalars("train", {"loss": 0.5}, step=3)
    assert [e.step for e in read(tmp_path / "train").Tensors("loss")] == [3]
    summaries.close()


def test_graph_is_written_for_the_graphs_tab(tmp_path):
    @tf.function
    def double(x):
        return x * 2.0

    summaries = SummaryManager(tmp_path)
    summaries.graph("train", double.get_concrete_function(tf.TensorSpec([], tf.float32)).graph)
    summaries.close()
    graph = read(tmp_path / "train").Graph()
    assert "mul" in {node.op.lower() for node in graph.node}


def test_images_are_the_bytes_tf_summary_image_writes(tmp_path):
    # The PNGs are made as `tf.summary.image` makes them (values times 255.5, truncated),
    # so an image looks the same as it did through TensorFlow's own writer.
    batch = np.random.default_rng(0).random((3, 6, 5, 3), dtype=np.float32)
    batch[0, 0, 0] = [0.0, 1.0, 0.999]
    summaries = SummaryManager(tmp_path / "ours")
    summaries.images("train", {"x": batch}, step=1, max_images=3)
    summaries.close()
    writer = tf.summary.create_file_writer(str(tmp_path / "tf"))
    with writer.as_default(step=1):
        tf.summary.image("x", batch, max_outputs=3)
    writer.close()
    [ours] = read(tmp_path / "ours" / "train").Tensors("x")
    [theirs] = read(tmp_path / "tf").Tensors("x")
    assert list(tf.make_ndarray(ours.tensor_proto)) == list(tf.make_ndarray(theirs.tensor_proto))
