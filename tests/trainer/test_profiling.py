"""Reading each tower's time from a trace file.

The CPU case is tested on real traces here and in test_run.py. A GPU trace cannot be made here (no
GPU), so the GPU case reads a hand-built XSpace shaped as TensorFlow's CUPTI collector
writes one: kernel events on a `/device:GPU:0` plane, named after the kernel, with the op
that launched them in a `tf_op` stat.
"""

import math
import re
import shutil
import time
from collections.abc import Callable
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


def mark_steps(space, steps: range, every_ps: int = 1000 * MS, at_ns: int = 0) -> None:
    """The loop's step markers (`train`, with a `step_num`), one after the other from
    `at_ns` on the host plane, `every_ps` each (made if the space has none)."""
    host = next((p for p in space.planes if p.name == "/host:CPU"), None)
    if host is None:
        host = space.planes.add(name="/host:CPU")
    marker = max(host.event_metadata, default=0) + 1
    step_num = max(host.stat_metadata, default=0) + 1
    host.event_metadata[marker].name = "train"
    host.stat_metadata[step_num].name = "step_num"
    line = host.lines.add(name="python", timestamp_ns=at_ns)
    for i, step in enumerate(steps):
        event = line.events.add(metadata_id=marker, offset_ps=i * every_ps, duration_ps=every_ps)
        event.stats.add(metadata_id=step_num, int64_value=step)


def write(tmp_path: Path, *planes, steps: range | None = range(1, 3)) -> Path:
    """An XSpace of `planes`, whose events all start at 0, inside the markers of `steps`."""
    space = _xplane_pb2().XSpace()
    for add in planes:
        add(space)
    if steps is not None:
        mark_steps(space, steps)
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(space.SerializeToString())
    return path


def test_tower_times_on_gpu_are_kernel_times_from_the_device_plane(tmp_path):
    trace = write(tmp_path, host_plane, gpu_plane)
    assert tower_times_ms(trace, towers=2, steps=range(1, 2)) == [2.0, 4.0]
    assert tower_times_ms(trace, towers=2, steps=range(1, 3)) == [1.0, 2.0]


def test_tower_times_without_gpus_are_the_host_op_times(tmp_path):
    trace = write(tmp_path, host_plane)
    assert tower_times_ms(trace, towers=2, steps=range(1, 2)) == [0.001, 0.001]


def test_towers_on_gpus_get_no_times_from_a_trace_without_their_kernels(tmp_path):
    # The profiler without CUPTI: TensorFlow logs it and traces the host alone, whose events
    # for GPU ops time their launch. Those must not be reported as the towers' compute.
    trace = write(tmp_path, host_plane)
    with pytest.raises(ValueError, match="Expected the trace to hold the towers' GPU kernels"):
        tower_times_ms(trace, towers=2, steps=range(1, 2), on_gpus=True)
    both = write(tmp_path, host_plane, gpu_plane)
    assert tower_times_ms(both, towers=2, steps=range(1, 2), on_gpus=True) == [2.0, 4.0]


def test_tower_times_count_only_the_traced_steps_window(tmp_path):
    # The profiler records on past the traced steps until its stop, off the loop, ends
    # it: ops that start before the first traced step's marker or after the last one's end
    # are other steps'. Steps 5 and 6 are traced, from 10 to 30 ms on the host's clock; a
    # marker of step 7 (a later trace's) does not widen the window.
    space = _xplane_pb2().XSpace()
    host = space.planes.add(name="/host:CPU")
    for key, name in ((1, "tower_0/dense/MatMul:MatMul"), (2, "tower_1/dense/MatMul:MatMul")):
        host.event_metadata[key].name = name
    ops = host.lines.add(name="tf_Compute", timestamp_ns=0)
    for key, at_ms, ms in (
        (1, 5, 100),  # starts before the window: a step before the trace
        (1, 12, 1),  # inside
        (2, 29, 2),  # starts inside, ends past it: counted
        (2, 31, 50),  # after: a step launched while the profiler stopped
        (1, 35, 64),  # inside step 7's marker, not a traced step's
    ):
        ops.events.add(metadata_id=key, offset_ps=at_ms * MS, duration_ps=ms * MS)
    mark_steps(space, range(5, 8), every_ps=10 * MS, at_ns=10 * 10**6)
    trace = tmp_path / "host.xplane.pb"
    trace.write_bytes(space.SerializeToString())
    assert tower_times_ms(trace, towers=2, steps=range(5, 7)) == [0.5, 1.0]

    # A GPU's kernels, on the host's clock: each line's time (ns) plus the event's offset.
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.event_metadata[1].name = "ampere_sgemm_128x64_nn"
    gpu.stat_metadata[1].name = "tf_op"
    for key, name in ((2, "tower_0/dense/MatMul:MatMul"), (3, "tower_1/dense/MatMul:MatMul")):
        gpu.stat_metadata[key].name = name
    for line_ms, events in (
        (20, [(2, 0, 4), (3, 9, 2), (3, 15, 8)]),  # at 20 and 29 ms inside; 35 ms after
        (0, [(2, 5, 6)]),  # at 5 ms, before
    ):
        line = gpu.lines.add(name="Stream #7(Kernel)", timestamp_ns=line_ms * 10**6)
        for op, at_ms, ms in events:
            kernel = line.events.add(metadata_id=1, offset_ps=at_ms * MS, duration_ps=ms * MS)
            kernel.stats.add(metadata_id=1, ref_value=op)
    trace.write_bytes(space.SerializeToString())
    assert tower_times_ms(trace, towers=2, steps=range(5, 7), on_gpus=True) == [2.0, 1.0]


def test_a_trace_without_the_traced_steps_markers_gives_no_times(tmp_path):
    # Counting all of it would add the steps the loop ran while the profiler stopped.
    for trace in (
        write(tmp_path, host_plane, steps=None),
        write(tmp_path, host_plane, steps=range(7, 9)),
    ):
        with pytest.raises(
            ValueError, match=r"to mark steps 1-2 \('train' events with a step_num\)"
        ):
            tower_times_ms(trace, towers=2, steps=range(1, 3))


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
    assert tower_times_ms(trace, towers=2, steps=range(1, 2)) == [3.0, 12.0]


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

    assert tower_times_ms(write(tmp_path, gpu), towers=2, steps=range(1, 2)) == [0.0, 7.0]


def cnn_steps() -> Callable[[], None]:
    """One `cnn` step on two logical CPU devices (tests/conftest.py), its loss read; the
    function is traced here, before any capture."""
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

    def step() -> None:
        float(trainer.train_step(images, labels)["loss"])

    step()
    return step


def marked(step: Callable[[], None], number: int) -> None:
    """`step` marked as the loop marks a traced step (`Controller._step`)."""
    with tf.profiler.experimental.Trace("train", step_num=number, _r=1):
        step()


def test_tower_times_of_a_real_step_hold_forward_and_backward(tmp_path):
    # A real trace of one `cnn` step on two logical CPU devices: every op of a tower,
    # forward (`tower_i/`) and backward (`gradient_tape/tower_i/`), counts.
    step = cnn_steps()
    capture = TraceCapture(tmp_path)
    assert capture.start()
    marked(step, 1)
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
    measured = tower_times_ms(trace, towers=2, steps=range(1, 2))
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


def test_an_ended_capture_counts_its_marked_steps_not_the_ones_after(tmp_path):
    # As the loop runs it: two marked steps, then steps it goes on with before the
    # profiler's stop (on `end`'s thread) ends the recording; 3 of them here, all recorded.
    step = cnn_steps()
    capture = TraceCapture(tmp_path)
    assert capture.start()
    for number in (1, 2):
        marked(step, number)
    for _ in range(3):
        step()
    ended = capture.end(range(1, 3), towers=2)
    assert not capture.active  # at once, for the loop: the next steps are not marked
    read = ended.result(timeout=60)
    assert read is not None and read.path.parent.name.endswith("_steps_1-2")

    # The steps run one after another (each reads its loss), so the first two fifths of
    # the towers' ops, in time order, are the marked steps'.
    space = _xplane_pb2().XSpace()
    space.ParseFromString(read.path.read_bytes())
    ops = []
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                tower = profiling._tower_index(plane.event_metadata[event.metadata_id].name)
                if tower is not None:
                    start = line.timestamp_ns * 1000 + event.offset_ps
                    ops.append((start, tower, event.duration_ps))
    ops.sort()
    assert ops and len(ops) % 5 == 0, len(ops)  # 5 steps of the same ops
    marked_ps = [sum(ps for _, t, ps in ops[: len(ops) * 2 // 5] if t == i) for i in (0, 1)]
    all_ps = [sum(ps for _, t, ps in ops if t == i) for i in (0, 1)]
    for i in (0, 1):
        assert read.tower_ms[i] == pytest.approx(marked_ps[i] / 2 / MS, abs=0.002)
        assert marked_ps[i] < all_ps[i]  # or the steps after were not in the trace at all
    capture.close()


def test_a_capture_started_while_one_stops_waits_for_that_stop(tmp_path, monkeypatch):
    # The profiler takes one session at a time: a start while the last capture's stop is
    # still on `end`'s thread failed ("Another profiler is running") and traced nothing.
    stop = tf.profiler.experimental.stop

    def slow_stop() -> None:
        time.sleep(0.5)
        stop()

    monkeypatch.setattr(profiling.tf.profiler.experimental, "stop", slow_stop)
    capture = TraceCapture(tmp_path)
    names = []
    for first in (1, 3):
        assert capture.start()
        marked(lambda: tf.constant(1.0) + 1.0, first)
        names.append(capture.end(range(first, first + 1), towers=2))
    capture.close()
    assert [n.result().path.parent.name[-6:] for n in names] == ["step_1", "step_3"]


def test_an_ended_capture_whose_times_cannot_be_read_gives_its_trace_and_why(tmp_path):
    # No step markers (or, on a GPU host, no kernels: no CUPTI): the trace is written and
    # TensorBoard shows it, so the loop still writes its line, with why in place of times.
    capture = TraceCapture(tmp_path)
    assert capture.start()
    tf.constant(1.0) + 1.0  # an op, but no step marked
    read = capture.end(range(4, 6), towers=2).result(timeout=60)
    capture.close()
    assert read is not None and read.tower_ms is None
    assert read.path.exists() and read.path.parent.name.endswith("_steps_4-5")
    assert read.error is not None and "Received: no marker of them" in read.error, read.error


def test_an_ended_capture_the_profiler_wrote_nothing_of_says_so(tmp_path, monkeypatch, caplog):
    # Nothing for the loop to write a line of: the log says why no trace line comes.
    stop = tf.profiler.experimental.stop

    def stop_and_lose_the_trace() -> None:
        stop()
        shutil.rmtree(tmp_path / "plugins")

    monkeypatch.setattr(profiling.tf.profiler.experimental, "stop", stop_and_lose_the_trace)
    capture = TraceCapture(tmp_path)
    assert capture.start()
    marked(lambda: tf.constant(1.0) + 1.0, 4)
    with caplog.at_level("WARNING", logger="trainer.profiling"):
        assert capture.end(range(4, 5), towers=2).result(timeout=60) is None
        capture.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"the profiler wrote no trace of step 4 under {tmp_path}"
    ]
