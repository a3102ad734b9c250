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
    assert message.startswith("Lost another worker of the cluster at step 33 (")
    assert "(stopped sending heartbeats): /job:worker/replica:0/task:1)." in message, message
    assert "The tasks have crashed" not in message, "one line, not TensorFlow's page"


def test_a_closed_socket_keeps_its_one_line():
    text = (
        "Collective ops is aborted by: Socket closed\nAdditional GRPC error information "
        "from remote target /job:worker/replica:0/task:0 while calling RecvBuf"
    )
    message = lost_worker(tf.errors.UnavailableError(None, None, text), 32)
    assert message is not None
    assert "(Socket closed; peer /job:worker/replica:0/task:0)" in message, message


def test_other_errors_are_not_a_lost_worker():
    assert lost_worker(tf.errors.InvalidArgumentError(None, None, "bad shape"), 3) is None
