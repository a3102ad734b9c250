"""Summaries as TensorBoard reads them back: the right plugin, the right values."""

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from trainer.summaries import SummaryManager, histogram_buckets


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


def test_histogram_buckets_constant_tensor():
    buckets = histogram_buckets(np.full((4, 4), 3.0))
    assert buckets[:, 2].sum() == 16 and buckets[0, 0] == 3.0 and buckets[-1, 1] == 4.0


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


def test_summary_manager_without_logdir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a writer given no folder would end up
    summaries = SummaryManager(None)
    summaries.scalars("train", {"loss": 1.0}, step=1)
    summaries.histograms("train", {"w": np.ones(3)}, step=1)
    summaries.images("train", {"x": np.zeros((1, 4, 4, 1), np.float32)}, step=1, max_images=1)
    summaries.close()
    assert list(tmp_path.iterdir()) == []
    assert summaries._writers == {}
