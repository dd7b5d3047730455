"""Runs under test: submission, the recorder, the event sink, reference workloads."""
