"""Reading each tower's time from a trace file.

The CPU case is tested on real traces in test_run.py. A GPU trace cannot be made here (no
GPU), so the GPU case reads a hand-built XSpace shaped as TensorFlow's CUPTI collector
writes one: kernel events on a `/device:GPU:0` plane, named after the kernel, with the op
that launched them in a `tf_op` stat.
"""

from pathlib import Path

from trainer.profiling import _xplane_pb2, tower_times_ms

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
