"""Test-wide set-up: the CPU split into logical devices, so towers run for real.

Logical devices can only be configured before TensorFlow's runtime starts, so this runs at
collection, before any test touches TensorFlow. Worker processes that tests start split
their own CPU.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

LOGICAL_CPUS = 4

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)
