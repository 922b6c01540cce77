"""The worker: ``python -m wsfleet.worker``."""
