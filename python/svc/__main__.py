"""``python -m svc``: the ``svc`` command (``svc.cli``), for environments without the script."""

from svc.cli import app

if __name__ == "__main__":
    app(prog_name="svc")
