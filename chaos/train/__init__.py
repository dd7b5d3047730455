"""Runs under test: submission, the recorder, the event log, reference workloads."""
