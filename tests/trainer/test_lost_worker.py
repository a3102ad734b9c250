"""The one line a worker writes when a collective failed because another worker is gone."""

import tensorflow as tf

from trainer.multiworker import lost_worker

# What TensorFlow 2.21 raised in a worker whose peer stopped (SIGSTOP: no more heartbeats).
UNHEALTHY = (
    "Collective ops is aborted by: Error reported from /job:worker/task:1: The following "
    "tasks are unhealthy (stopped sending heartbeats):\n"
    "/job:worker/replica:0/task:1\n"
    "The tasks have crashed. Check the task logs for an earlier error, or scheduler events "
    "(e.g. preemption, eviction) to debug further.\n"
    "The error could be from a previous operation. Restart your program to reset.\n"
    "\t [[{{node average/CollectiveReduceV2}}]] [Op:__inference__train_step_775]"
)


def test_a_worker_without_heartbeats_is_named():
    message = lost_worker(tf.errors.UnavailableError(None, None, UNHEALTHY), 33)
    assert message is not None
    assert message.startswith(
        "Lost another worker of the cluster at step 33 (Error reported from worker-1: "
    ), "named as TF_CONFIG names it"
    assert "(stopped sending heartbeats): worker-1)." in message, message
    assert "The tasks have crashed" not in message, "one line, not TensorFlow's page"


def test_every_task_gone_is_named_within_the_line():
    # Seven workers of eight gone at once (a rack down): TensorFlow's names of them, 28
    # characters each, ran past the line's limit and the last ones were cut off.
    gone = "\n".join(f"/job:worker/replica:0/task:{i}" for i in range(1, 8))
    text = UNHEALTHY.replace("/job:worker/replica:0/task:1\n", gone + "\n")
    message = lost_worker(tf.errors.UnavailableError(None, None, text), 33)
    assert message is not None
    names = " ".join(f"worker-{i}" for i in range(1, 8))  # TensorFlow's lines, joined
    assert f"(stopped sending heartbeats): {names})." in message, message


def test_a_closed_socket_keeps_its_one_line():
    text = (
        "Collective ops is aborted by: Socket closed\nAdditional GRPC error information "
        "from remote target /job:worker/replica:0/task:0 while calling RecvBuf"
    )
    message = lost_worker(tf.errors.UnavailableError(None, None, text), 32)
    assert message is not None
    assert "(Socket closed; peer worker-0)" in message, message


def test_other_errors_are_not_a_lost_worker():
    assert lost_worker(tf.errors.InvalidArgumentError(None, None, "bad shape"), 3) is None


# What a worker raised when the chief stopped answering (SIGSTOP, a hung host): the chief
# hosts the coordination service, and the heartbeats to it time out.
CHIEF_SILENT = (
    "Collective ops is aborted by: Deadline Exceeded\n"
    "RPC: /tensorflow.CoordinationService/Heartbeat\n"
    "The error could be from a previous operation. Restart your program to reset.\n"
    "\t [[{{node average/CollectiveReduceV2_1}}]] [Op:__inference__train_step_775]"
)


def test_a_chief_that_stops_answering_is_a_lost_worker():
    message = lost_worker(tf.errors.DeadlineExceededError(None, None, CHIEF_SILENT), 100)
    assert message is not None
    assert message.startswith("Lost another worker of the cluster at step 100 (Deadline"), message
    assert "Start every worker again" in message


def test_a_deadline_elsewhere_is_not_a_lost_worker():
    error = tf.errors.DeadlineExceededError(None, None, "Timed out reading gs://bucket/x")
    assert lost_worker(error, 3) is None


def test_a_worker_lost_while_the_cluster_starts_says_so():
    text = "{{function_node __wrapped__CollectiveBcastSend_device_/job:worker}} Socket closed"
    message = lost_worker(tf.errors.UnavailableError(None, None, text), None)
    assert message == (
        "Lost another worker of the cluster while the cluster was starting "
        "(UnavailableError). Start every worker again: they resume from the newest "
        "checkpoint they all have."
    )


def test_a_long_cause_is_cut_to_one_short_line():
    text = "Collective ops is aborted by: " + "x" * 2000
    message = lost_worker(tf.errors.AbortedError(None, None, text), 5)
    assert message is not None and len(message) < 450, len(message or "")
    assert "…" in message
