"""Alembic migrations of the policy service's database (``svc.policy.migrate`` applies them)."""
