"""Towerboard's service: API, job store, scheduler, workers, TensorBoard. Never imports TensorFlow."""
