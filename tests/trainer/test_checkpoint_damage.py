"""What a damaged checkpoint's reason says: the job's message repeats it per checkpoint."""

import os
from pathlib import Path

import pytest
import tensorflow as tf

from trainer.checkpoints import _damage


@pytest.mark.parametrize(
    "damage",
    [
        lambda prefix: os.truncate(f"{prefix}.data-00000-of-00001", 100),
        lambda prefix: os.unlink(f"{prefix}.data-00000-of-00001"),
    ],
    ids=["data-cut-short", "data-missing"],
)
def test_a_damaged_checkpoints_reason_leaves_out_tensorflows_function_and_op_names(
    tmp_path: Path, damage
) -> None:
    # "checkpoints/ckpt-60 is damaged: {{function_node __wrapped__RestoreV2_dtypes_13_
    # device_/job:localhost/replica:0/task:0/device:CPU:0}} Read less bytes than requested
    # [Op:RestoreV2]", once for each checkpoint, in the one-line message a failed job shows.
    checkpoint = tf.train.Checkpoint(v=tf.Variable(tf.zeros([1000])))
    prefix = checkpoint.write(str(tmp_path / "ckpt-1"))
    damage(prefix)
    reason = _damage(prefix)
    assert reason is not None
    assert "function_node" not in reason and "[Op:" not in reason, reason
    assert reason.strip() and "\n" not in reason
