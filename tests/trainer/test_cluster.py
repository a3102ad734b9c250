"""`TF_CONFIG` as the trainer reads it (no TensorFlow needed)."""

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import trainer.cluster as cluster_module
from trainer.cluster import Cluster, ClusterError, cluster_from_env, wait_for_peers


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


# Tasks at IPv6 addresses need one to listen on; a container may run with IPv6 off.
NO_IPV6 = pytest.mark.skipif(
    not _has_ipv6_loopback(), reason="this host has no IPv6 loopback (::1) to listen on"
)

REPO = Path(__file__).resolve().parents[2]


def config(cluster: object, task: object) -> dict[str, str]:
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


def test_no_tf_config_is_one_worker():
    for environ in ({}, {"TF_CONFIG": ""}, {"TF_CONFIG": "  "}):
        cluster = cluster_from_env(environ)
        assert cluster == Cluster() and not cluster.is_multi_worker and cluster.is_chief


def test_workers_only_the_first_is_chief(tmp_path):
    workers = {"worker": ["a:1", "b:1", "c:1"]}
    first = cluster_from_env(config(workers, {"type": "worker", "index": 0}))
    third = cluster_from_env(config(workers, {"type": "worker", "index": 2}))
    assert (first.workers, first.index, first.is_chief, first.is_multi_worker) == (3, 0, True, True)
    assert (third.index, third.is_chief, third.name) == (2, False, "worker-2")
    assert first.run_dir(tmp_path) == tmp_path
    assert third.run_dir(tmp_path) == tmp_path / "workers" / "worker-2"


def test_a_chief_task_comes_before_the_workers():
    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    chief = cluster_from_env(config(cluster, {"type": "chief", "index": 0}))
    worker = cluster_from_env(config(cluster, {"type": "worker", "index": 0}))
    assert (chief.workers, chief.index, chief.is_chief) == (3, 0, True)
    assert (worker.index, worker.is_chief, worker.name) == (1, False, "worker-0")


def test_a_one_worker_cluster_needs_no_index_nor_a_port():
    # It trains as one process: TensorFlow never reads its TF_CONFIG.
    cluster = cluster_from_env(config({"worker": ["localhost"]}, {"type": "worker"}))
    assert not cluster.is_multi_worker and cluster.is_chief


def test_a_one_worker_cluster_is_not_multi_worker():
    cluster = cluster_from_env(config({"worker": ["a:1"]}, {"type": "worker", "index": 0}))
    assert not cluster.is_multi_worker and cluster.is_chief


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"TF_CONFIG": "{not json"}, "expected JSON"),
        ({"TF_CONFIG": "[1]"}, "expected a JSON object"),
        (config({}, {"type": "worker", "index": 0}), "expected `cluster`"),
        (config({"worker": "a:1"}, {"type": "worker", "index": 0}), "list of host:port"),
        (config({"worker": ["a:1"], "ps": ["b:1"]}, {"type": "worker"}), "'ps' is not used"),
        (config({"worker": ["a:1"], "evaluator": ["b:1"]}, {"type": "worker"}), "evaluator"),
        (config({"chief": ["a:1", "b:1"]}, {"type": "chief"}), "at most one chief"),
        (config({"worker": ["a:1", "b:1"]}, None), "expected `task`"),
        (config({"worker": ["a:1", "b:1"]}, {"type": "chief"}), "`task.type`"),
        (config({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": 2}), "0..1"),
        (config({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": "1"}), "`task.index`"),
        (config({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": True}), "`task.index`"),
        (config({"worker": ["a:1", "b:1"]}, {"type": "worker"}), "expected `task.index`"),
        (config({"worker": ["a:1", "b:99999"]}, {"type": "worker", "index": 0}), "1..65535"),
        (config({"worker": ["a:0", "b:1"]}, {"type": "worker", "index": 1}), "1..65535"),
        (config({"worker": ["a:1", "b"]}, {"type": "worker", "index": 0}), "host:port"),
        # Each of these raised another error than ClusterError (a traceback, exit 1):
        (config({"worker": ["a:1", "b:1"]}, {"type": ["worker"], "index": 0}), "`task.type`"),
        (config({"worker": ["a:1", "b:1"]}, {"type": {"worker": 0}, "index": 0}), "`task.type`"),
        ({"TF_CONFIG": "[" * 100_000}, "expected JSON"),
        # Which worker this is, were the last `index` taken, would be a guess.
        (
            {
                "TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, '
                '"task": {"type": "worker", "index": 0, "index": 1}}'
            },
            "Duplicate key `task.index`: given at line 1 column 68 and again at line 1 column 80",
        ),
        ({"TF_CONFIG": '{"task": {"index": 1' + "0" * 5000 + "}}"}, "expected JSON"),
        (
            config({"worker": ["a:1", "b:1" + "0" * 5000]}, {"type": "worker", "index": 0}),
            "1..65535",
        ),
        (config({"worker": ["a:1", "x" * 64 + ":1"]}, {"type": "worker", "index": 0}), "host name"),
        (config({"worker": ["a:1", "a..b:1"]}, {"type": "worker", "index": 0}), "host name"),
        (config({"worker": ["a:1", "\udcff:1"]}, {"type": "worker", "index": 0}), "host name"),
    ],
)
def test_bad_tf_config_says_what_is_wrong(environ, message):
    with pytest.raises(ClusterError, match="TF_CONFIG") as error:
        cluster_from_env(environ)
    assert message in str(error.value)
    assert "Received:" in str(error.value)


@pytest.mark.parametrize(
    ("tf_config", "reason"),
    [
        ({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}}, "'ps' is not used"),
        # A list is no key of `cluster`: the lookup raised TypeError (exit 1, a traceback).
        (
            {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": ["worker"], "index": 0}},
            "expected `task.type` to be one of ['worker']. Received: ['worker']",
        ),
    ],
    ids=["ps", "type-list"],
)
def test_a_worker_with_a_bad_tf_config_exits_2_before_importing_tensorflow(
    tmp_path, tf_config, reason
):
    # The check runs before TensorFlow is imported: the worker must not connect anywhere.
    code = (
        "import sys\nfrom pathlib import Path\nfrom trainer.run import run_job\n"
        f"rc = run_job(Path({str(tmp_path)!r}), Path({str(tmp_path / 'missing.json')!r}))\n"
        "assert 'tensorflow' not in sys.modules\nsys.exit(int(rc))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={"TF_CONFIG": json.dumps(tf_config), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert reason in proc.stderr and "Traceback" not in proc.stderr
    # Nothing written: the job dir may be a running chief's (the same task started twice).
    assert list(tmp_path.iterdir()) == []


def test_another_worker_started_without_spec_reads_its_own_copy(tmp_path):
    # Hosts with job dirs of their own: worker 1's copy of the spec is in its directory,
    # and the job dir has none. Started again without --spec, it must find that one (it
    # said "Spec file not found"). A stop already asked ends it at the wait for the others.
    own = tmp_path / "workers" / "worker-1"
    own.mkdir(parents=True)
    spec = {"model": {"name": "mlp"}, "data": {"format": "synthetic"}, "steps": 5}
    (own / "spec.json").write_text(json.dumps(spec))
    code = (
        "import sys, threading\nfrom pathlib import Path\nfrom trainer.run import run_job\n"
        "stop = threading.Event()\nstop.set()\n"
        f"sys.exit(int(run_job(Path({str(tmp_path)!r}), stop=stop)))\n"
    )
    with socket.socket() as one, socket.socket() as other:  # two free ports
        one.bind(("127.0.0.1", 0))
        other.bind(("127.0.0.1", 0))
        ports = [one.getsockname()[1], other.getsockname()[1]]
    tf_config = {
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
        "task": {"type": "worker", "index": 1},
    }
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={"TF_CONFIG": json.dumps(tf_config), "PATH": "", "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    result = json.loads((own / "result.json").read_text())
    assert "while waiting for the other tasks" in result["message"], result
    assert not (tmp_path / "spec.json").exists()


def _two_tasks(own: int, other: int) -> Cluster:
    return Cluster(workers=2, index=0, addresses=(f"127.0.0.1:{own}", f"127.0.0.1:{other}"))


def test_a_port_the_last_run_left_in_time_wait_is_listened_on_again():
    # Workers started again at once to resume: the last run's TensorFlow server (which,
    # as gRPC does, set SO_REUSEADDR) left connections in TIME_WAIT on the task's port for
    # a minute, and the wait refused the port as "another process using" it (exit 2).
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server's side closes first: it is the one in TIME_WAIT
        server.close()
        client.recv(1)
        client.close()
        assert wait_for_peers(_two_tasks(port, other.getsockname()[1]), threading.Event())


def _shares_its_port(running: socket.socket) -> None:
    # TensorFlow's gRPC server listens with SO_REUSEADDR and SO_REUSEPORT.
    running.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    running.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    running.bind(("0.0.0.0", 0))


def _on_ipv6_alone(running: socket.socket) -> None:
    running.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    running.bind(("::", 0))


@pytest.mark.parametrize(
    ("family", "bind"),
    [
        (socket.AF_INET, _shares_its_port),
        pytest.param(socket.AF_INET6, _on_ipv6_alone, marks=NO_IPV6),
    ],
    # The task listens on IPv6 too (as TensorFlow's server does): a port taken there
    # alone would answer another task's probe of this one from the other process.
    ids=["one-that-shares-it", "on-ipv6-alone"],
)
def test_a_port_another_process_listens_on_is_refused(family, bind):
    # A second copy of a running worker must be refused.
    with socket.socket(family) as running, socket.socket() as other:
        bind(running)
        running.listen()
        other.bind(("127.0.0.1", 0))
        other.listen()
        cluster = _two_tasks(running.getsockname()[1], other.getsockname()[1])
        with pytest.raises(ClusterError, match="cannot listen on this task's address"):
            wait_for_peers(cluster, threading.Event())


@pytest.mark.parametrize(
    "hosts",
    [
        # Another task's index (host-a given 1): every host has the same port, so the
        # chief's address, host-a's own, answered from this task's listener.
        ("127.0.0.1", "127.0.0.2"),
        ("127.0.0.1", "127.0.0.1"),  # one address given to two tasks
        pytest.param(("[::1]", "[::1]"), marks=NO_IPV6),  # the same, on IPv6: its own listener
    ],
    ids=["index-of-another-host", "one-address-twice", "one-ipv6-address-twice"],
)
def test_another_tasks_address_that_is_this_tasks_own_is_refused(hosts):
    # It passed the wait at once, and TensorFlow then waited for a task that never came.
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    cluster = Cluster(workers=2, index=1, addresses=tuple(f"{h}:{port}" for h in hosts))
    # Refused at once; not refused, the wait goes on for ever (the IPv6 case did, while
    # the task listened on IPv4 alone): stopped after 20 s, it then fails here, not at the
    # suite's 600 s timeout.
    stop = threading.Event()
    timer = threading.Timer(20, stop.set)
    timer.start()
    try:
        with pytest.raises(ClusterError, match=r"another task's address is this task's own"):
            wait_for_peers(cluster, stop)
    finally:
        timer.cancel()


def test_another_tasks_probe_from_this_probes_local_port_is_not_taken_for_its_own(
    monkeypatch,
):
    # Linux gives one local port to live connections to different places: another task's
    # probe of this one, queued on this task's listener, may come from the very address
    # this task's probe of it left from. It was taken for this task's own probe, and a
    # healthy task exited 2 saying another's address was its own.
    with (
        socket.socket() as ours,
        socket.socket() as theirs,
        socket.socket() as their_probe,
    ):
        for listener in (ours, theirs):
            listener.bind(("127.0.0.1", 0))
            listener.listen()
        ours.setblocking(False)
        their_probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        their_probe.bind(("127.0.0.1", 0))
        shared = their_probe.getsockname()
        their_probe.connect(ours.getsockname())

        def from_the_same_port(address, timeout=None):
            probe = socket.socket()
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(shared)
            probe.settimeout(timeout)
            probe.connect(address)
            return probe

        monkeypatch.setattr(cluster_module.socket, "create_connection", from_the_same_port)
        address = f"127.0.0.1:{theirs.getsockname()[1]}"
        assert cluster_module._answers(address, [ours], "worker-0", {})


def test_the_wait_logs_why_each_task_does_not_answer(caplog):
    # Why: a host name with a typo ("Name or service not known") waited logged as a host
    # not started yet. Here a port nothing listens on (no name lookup: this runs offline).
    with socket.socket() as free, socket.socket() as other:
        free.bind(("127.0.0.1", 0))
        other.bind(("127.0.0.1", 0))  # bound, not listening: refused
        own, closed = free.getsockname()[1], other.getsockname()[1]
        free.close()
        cluster = _two_tasks(own, closed)
        stop = threading.Event()
        threading.Timer(1.2, stop.set).start()
        with caplog.at_level("INFO", logger="trainer.cluster"):
            assert not wait_for_peers(cluster, stop, log_every=0.5)
    still = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
    assert still, caplog.text
    assert f"127.0.0.1:{closed} (Connection refused): not started yet" in still[-1]
