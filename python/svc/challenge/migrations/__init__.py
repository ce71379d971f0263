"""Alembic migrations of the challenge service's database (``svc.challenge.migrate`` runs them)."""
