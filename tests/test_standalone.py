"""The repository stands alone: a clone with nothing beside it builds, runs its README and passes
its tests (docs/dev.md, "Test data").

* No tracked file points outside the clone for data (a `shared` directory beside it): the
  README, docs, tests and benches name in-repository paths.
* The third-party test data kept in `tests/testdata/` is complete and carries its license and a
  README.md naming where it comes from (Apache-2.0 section 4 and the MIT License both require the
  license text to travel with the copies).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import CEDAR_EXAMPLES, CLOUDTRAIL, REPO

# Paths that lead out of the clone: a `shared` directory beside it, its `data` folder (also as
# pathlib's `"shared" [/] "data"`), or an absolute path to one. Written with `[/]` so this file does
# not match itself.
OUTSIDE = re.compile(rb'\.\.[/]shared\b|\bshared[/]data\b|/work[/]shared\b|"shared"\s*[/]\s*"data"')

CEDAR_APPS = {"document_cloud", "github_example", "streaming_service", "tags_n_roles", "tinytodo"}


def tracked_files() -> list[Path]:
    """Every file git tracks in this clone (`git ls-files`), as absolute paths."""
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    ).stdout
    return [REPO / name.decode() for name in out.split(b"\0") if name]


def test_no_tracked_file_points_outside_the_clone() -> None:
    hits = []
    for path in tracked_files():
        if not path.is_file():  # deleted in the work tree but not yet in the index
            continue
        for n, line in enumerate(path.read_bytes().splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.decode(errors='replace')}")
    assert not hits, "paths outside the repository:\n" + "\n".join(hits)


def test_cedar_examples_are_complete_with_their_license() -> None:
    apps = {p.name for p in CEDAR_EXAMPLES.iterdir() if p.is_dir()}
    assert apps == CEDAR_APPS
    for app in sorted(apps):
        for name in ("policies.cedar", "entities.json"):
            assert (CEDAR_EXAMPLES / app / name).is_file(), f"{app}/{name}"
        assert list((CEDAR_EXAMPLES / app).glob("*.cedarschema")), f"{app}: no schema"
    assert "Apache License" in (CEDAR_EXAMPLES / "LICENSE").read_text()
    readme = (CEDAR_EXAMPLES / "README.md").read_text()
    assert "https://github.com/cedar-policy/cedar-examples" in readme
    assert "unchanged" in readme


def test_cloudtrail_samples_are_complete_with_their_license() -> None:
    files = sorted(p.name for p in CLOUDTRAIL.glob("*.json.gz"))
    assert len(files) == 2, files
    assert (CLOUDTRAIL / "LICENSE-MIT").read_text().startswith("MIT License")
    readme = (CLOUDTRAIL / "README.md").read_text()
    assert "https://github.com/ccbrown/cloud-snitch" in readme
    assert "unchanged" in readme
