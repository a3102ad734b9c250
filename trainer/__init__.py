"""Towerboard's trainer: everything TensorFlow lives below this package.

Importing `trainer` (or `trainer.spec`, `trainer.rundir`) must not import TensorFlow: the
service validates specs and reads run directories with these modules.
"""
