"""The layers of ``python/svc`` hold (docs/architecture.md#layers).

* ``lint-imports`` (import-linter, configured in pyproject.toml's ``[tool.importlinter]``):
  the commands (``svc.cli``) above ``svc up`` and ``svc topology``, those above the component
  registry (``svc.registry``), the registry above the demo and the components, the components
  above ``svc.common``, and ``svc.common`` above the base modules; no layer imports one above.
* No module but a command-line one (or ``python -m svc``) imports a command-line module (``svc.cli``, ``svc.<c>.cli``),
  and a component's command-line module imports only its own package's and the shared
  ``svc.common.cli``: services and transports never depend on how they are started.

Both read the import graph as grimp builds it (the library import-linter runs on), type-checking
imports left out.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parent.parent


def _is_cli(module: str) -> bool:
    """Whether `module` is a command-line module: ``svc.cli`` or ``svc.<package>.cli``."""
    parts = module.split(".")
    return module == "svc.cli" or (len(parts) >= 3 and parts[2] == "cli")


def cli_import_breaks(graph: grimp.ImportGraph) -> list[str]:
    """Each import that breaks the command-line rule of the module docs, as ``A -> B``."""
    breaks = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if not _is_cli(imported):
                continue
            allowed = importer in ("svc.cli", "svc.__main__") or (
                _is_cli(importer)
                and (
                    imported == "svc.common.cli"
                    or imported.split(".")[:2] == importer.split(".")[:2]
                )
            )
            if not allowed:
                breaks.append(f"{importer} -> {imported}")
    return breaks


def test_lint_imports_finds_the_layers_kept() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None, "import-linter is a dev dependency (pyproject.toml)"
    done = subprocess.run(
        [exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 1 kept, 0 broken." in done.stdout, done.stdout


def test_no_service_or_transport_imports_a_command_line_module() -> None:
    graph = grimp.build_graph("svc", exclude_type_checking_imports=True)
    # The rule sees real edges: the command reaches every component's command line.
    assert "svc.policy.cli" in graph.find_modules_directly_imported_by("svc.cli")
    assert cli_import_breaks(graph) == []


def test_the_rule_names_a_service_importing_a_command_line_module() -> None:
    graph = grimp.ImportGraph()
    for m in ("svc", "svc.gateway", "svc.gateway.service", "svc.policy", "svc.policy.cli"):
        graph.add_module(m)
    graph.add_import(importer="svc.gateway.service", imported="svc.policy.cli")
    assert cli_import_breaks(graph) == ["svc.gateway.service -> svc.policy.cli"]
