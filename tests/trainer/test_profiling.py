"""Reading each tower's time from a trace file.

The CPU case is tested on real traces here and in test_run.py. A GPU trace cannot be made here (no
GPU), so the GPU case reads a hand-built XSpace shaped as TensorFlow's CUPTI collector
writes one: kernel events on a `/device:GPU:0` plane, named after the kernel, with the op
that launched them in a `tf_op` stat.
"""

import math
import re
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer import profiling
from trainer.models import build_model
from trainer.optim import make_optimizer
from trainer.profiling import TraceCapture, _xplane_pb2, tower_times_ms
from trainer.spec import ModelSpec, OptimizerSpec
from trainer.towers import TowerTrainer

MS = 10**9  # picoseconds


def host_plane(space) -> None:
    plane = space.planes.add(name="/host:CPU")
    for key, name in ((1, "tower_0/dense/MatMul:MatMul"), (2, "tower_1/dense/MatMul:MatMul")):
        plane.event_metadata[key].name = name
    line = plane.lines.add(name="TensorFlow Ops")
    # On a GPU host these are the ops' launches: microseconds, not their compute.
    line.events.add(metadata_id=1, duration_ps=MS // 1000)
    line.events.add(metadata_id=2, duration_ps=MS // 1000)


def gpu_plane(space) -> None:
    plane = space.planes.add(name="/device:GPU:0")
    plane.event_metadata[1].name = "ampere_sgemm_128x64_nn"
    for key, name in (
        (1, "tf_op"),
        (2, "tower_0/dense/MatMul:MatMul"),
        (3, "tower_1/dense/MatMul:MatMul"),
        (4, "correlation_id"),
    ):
        plane.stat_metadata[key].name = name
    line = plane.lines.add(name="Stream #7(Kernel)")
    line.events.add(metadata_id=1, duration_ps=2 * MS).stats.add(metadata_id=1, ref_value=2)
    line.events.add(metadata_id=1, duration_ps=3 * MS).stats.add(metadata_id=1, ref_value=3)
    line.events.add(metadata_id=1, duration_ps=1 * MS).stats.add(
        metadata_id=1, str_value="tower_1/dense/BiasAdd:BiasAdd"
    )
    line.events.add(metadata_id=1, duration_ps=5 * MS).stats.add(
        metadata_id=4, int64_value=9
    )  # no op: not a tower's


def write(tmp_path: Path, *planes) -> Path:
    space = _xplane_pb2().XSpace()
    for add in planes:
        add(space)
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(space.SerializeToString())
    return path


def test_tower_times_on_gpu_are_kernel_times_from_the_device_plane(tmp_path):
    trace = write(tmp_path, host_plane, gpu_plane)
    assert tower_times_ms(trace, towers=2, steps=1) == [2.0, 4.0]
    assert tower_times_ms(trace, towers=2, steps=2) == [1.0, 2.0]


def test_tower_times_without_gpus_are_the_host_op_times(tmp_path):
    trace = write(tmp_path, host_plane)
    assert tower_times_ms(trace, towers=2, steps=1) == [0.001, 0.001]


def test_towers_on_gpus_get_no_times_from_a_trace_without_their_kernels(tmp_path):
    # The profiler without CUPTI: TensorFlow logs it and traces the host alone, whose events
    # for GPU ops time their launch. Those must not be reported as the towers' compute.
    trace = write(tmp_path, host_plane)
    with pytest.raises(ValueError, match="Expected the trace to hold the towers' GPU kernels"):
        tower_times_ms(trace, towers=2, steps=1, on_gpus=True)
    both = write(tmp_path, host_plane, gpu_plane)
    assert tower_times_ms(both, towers=2, steps=1, on_gpus=True) == [2.0, 4.0]


def backward_host_plane(space) -> None:
    """Host events of one CPU step as TensorFlow names them: the gradient tape puts each
    tower's backward ops under `gradient_tape/tower_i/`, an eval's under `eval/tower_i/`."""
    plane = space.planes.add(name="/host:CPU")
    names = {
        1: "tower_0/dense/MatMul:MatMul",
        2: "gradient_tape/tower_0/dense/MatMul/MatMul_1:MatMul",
        3: "gradient_tape/tower_1/dense/BiasAdd/BiasAddGrad:BiasAddGrad",
        4: "replica_1/gradient_tape/replica_1/tower_1/dense/MatMul/MatMul:MatMul",
        5: "eval/tower_0/dense/MatMul:MatMul",
        6: "average/AddN:AddN",
    }
    for key, name in names.items():
        plane.event_metadata[key].name = name
    line = plane.lines.add(name="tf_Compute")
    for key, ms in ((1, 1), (2, 2), (3, 4), (4, 8), (5, 16), (6, 32)):
        line.events.add(metadata_id=key, duration_ps=ms * MS)


def test_tower_times_count_the_backward_pass(tmp_path):
    trace = write(tmp_path, backward_host_plane)
    assert tower_times_ms(trace, towers=2, steps=1) == [3.0, 12.0]


def test_tower_times_on_gpu_count_the_backward_kernels(tmp_path):
    def gpu(space) -> None:
        plane = space.planes.add(name="/device:GPU:1")
        plane.event_metadata[1].name = "sm80_xmma_wgrad"
        plane.stat_metadata[1].name = "tf_op"
        line = plane.lines.add(name="Stream #9(Kernel)")
        line.events.add(metadata_id=1, duration_ps=7 * MS).stats.add(
            metadata_id=1,
            str_value="gradient_tape/tower_1/conv2d/Conv2DBackpropFilter:Conv2DBackpropFilter",
        )

    assert tower_times_ms(write(tmp_path, gpu), towers=2, steps=1) == [0.0, 7.0]


def test_tower_times_of_a_real_step_hold_forward_and_backward(tmp_path):
    # A real trace of one `cnn` step on two logical CPU devices (tests/conftest.py): every op
    # of a tower, forward (`tower_i/`) and backward (`gradient_tape/tower_i/`), counts.
    keras.utils.set_random_seed(0)
    with tf.device("/CPU:0"):
        model = build_model(ModelSpec(name="cnn"), (8, 8, 1), 4).model
        trainer = TowerTrainer(
            model=model,
            optimizer=make_optimizer(OptimizerSpec(name="sgd")),
            tower_devices=["/CPU:0", "/CPU:1"],
            parameter_device="/CPU:0",
        )
    images = tf.random.stateless_uniform((16, 8, 8, 1), seed=(1, 2))
    labels = tf.constant(np.arange(16) % 4, tf.int32)
    trainer.train_step(images, labels)  # traces the function, outside the capture
    capture = TraceCapture(tmp_path)
    assert capture.start()
    float(trainer.train_step(images, labels)["loss"])
    trace = capture.stop()
    assert trace is not None

    space = _xplane_pb2().XSpace()
    space.ParseFromString(trace.read_bytes())
    forward, backward = [0, 0], [0, 0]
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                for i in range(2):
                    if name.startswith(f"tower_{i}/"):
                        forward[i] += event.duration_ps
                    elif name.startswith(f"gradient_tape/tower_{i}/"):
                        backward[i] += event.duration_ps
    assert all(backward), "the trace names each tower's backward ops gradient_tape/tower_i/"
    measured = tower_times_ms(trace, towers=2, steps=1)
    for i in range(2):
        assert measured[i] == pytest.approx((forward[i] + backward[i]) / MS, abs=0.002)


def test_captures_that_end_within_one_second_keep_both_traces(tmp_path):
    # The profiler names a capture's folder by the second it stops in. A trace of steps
    # 200-201 (with an eval between them, so it spanned a second's turn) was written over
    # by a trace of 204-205 that started after that turn and stopped within the same second.
    capture = TraceCapture(tmp_path)
    x = tf.constant(1.0)
    assert capture.start()
    x += 1.0
    time.sleep(math.floor(time.time()) + 1.05 - time.time())  # past a second's turn
    first = capture.stop()
    assert capture.start()
    x += 1.0
    second = capture.stop()
    assert first is not None and second is not None and first != second
    assert sorted(tmp_path.glob("plugins/profile/*/*.xplane.pb")) == [first, second]
    assert first.read_bytes() != second.read_bytes()


def test_captures_named_by_their_steps_never_wait_and_keep_every_trace(tmp_path, monkeypatch):
    # Named by its steps, a capture leaves the profiler's folder name at once, so the next
    # one, in the same second or not, cannot write over it: no second is waited out on the
    # loop (trace steps 100 and 200 of a 4 ms GPU step had waited a second).
    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"waited {seconds:.2f} s on the loop")

    monkeypatch.setattr(profiling.time, "sleep", no_sleep)
    capture = TraceCapture(tmp_path)
    traces = []
    for step in (100, 200, 300):
        assert capture.start()
        tf.constant(float(step)) + 1.0
        traces.append(capture.stop((step, step)))
    assert all(trace is not None and trace.exists() for trace in traces)
    assert [trace.parent.name.rsplit("_", 1)[1] for trace in traces] == ["100", "200", "300"]
    assert sorted(tmp_path.glob("plugins/profile/*/*.xplane.pb")) == sorted(traces)


def test_a_capture_is_named_by_the_steps_it_holds(tmp_path):
    # The profile plugin lists a job's traces by folder name: the profiler's own is the time
    # alone, which says nothing of which steps a trace holds.
    capture = TraceCapture(tmp_path)
    names = []
    for steps in ((20, 22), (7, 7)):
        assert capture.start()
        tf.constant(1.0) + 1.0
        trace = capture.stop(steps)
        assert trace is not None and trace.exists()
        names.append(trace.parent.name)
    assert names[0].endswith("_steps_20-22") and names[1].endswith("_step_7")
    # The time the profiler named it by stays first: the runs sort by when they were taken.
    assert all(re.fullmatch(r"\d{4}(_\d\d){5}_steps?_[\d-]+", name) for name in names), names
    assert sorted(p.name for p in (tmp_path / "plugins" / "profile").iterdir()) == sorted(names)
    assert capture.start()
    assert capture.stop().parent.name.count("_") == 5  # no steps given: the profiler's name
