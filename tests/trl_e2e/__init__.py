"""Offline end-to-end harness: a real TRL ``GRPOTrainer`` on 2 CPU ranks (gloo).

See ``run.py`` (``run_grpo``) for the entry point used by tests.
"""
