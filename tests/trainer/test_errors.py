"""One line from a real TensorFlow error: what a job's result.json says when its step fails."""

import pytest
import tensorflow as tf

from trainer.errors import one_line


def test_one_line_of_an_op_that_fails_as_the_step_runs():
    # An assert inside a tf.function fails when the graph runs: TensorFlow's message is
    # "Graph execution error:", the node, then every frame of the stack that defined it,
    # each with its full path (2,500 characters and this machine's paths, from a job).
    count = tf.Variable(4.0)

    @tf.function
    def step():
        tf.debugging.assert_less(count, 4.0, message="fuse blew")
        return count + 1

    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        step()
    text = str(error.value)
    assert "defined at (most recent call last)" in text and 'File "' in text

    line = one_line(error.value)
    assert "\n" not in line and 'File "' not in line and "site-packages" not in line
    assert "tests/trainer" not in line  # the user's file by name only
    assert line.startswith("InvalidArgumentError: assertion failed: [fuse blew] ")
    assert "[Op:" not in line and "{{node" not in line
    assert line.endswith(", test_errors.py line 17, in step)"), line
    assert "(at node assert_less/Assert/AssertGuard/Assert, " in line, line


def test_one_line_leaves_a_plain_message_as_it_is():
    assert one_line(ValueError("Expected 3 channels.\nReceived: 1")) == (
        "ValueError: Expected 3 channels. Received: 1"
    )
