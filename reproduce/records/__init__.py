"""Runs as files: sweep specs -> planned runs; their records, checkpoints, averaging, claims, and
trainings shared between tables."""
