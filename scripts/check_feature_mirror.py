#!/usr/bin/env python3
"""Warns when python/Cargo.toml's feature mirror no longer matches the workspace.

`maturin develop` builds the package spate-python on its own, so cargo resolves features for
its dependency graph alone. If a crate in that graph ends up with other features than in
`cargo test --workspace`, maturin compiles it, and everything above it (DataFusion), a second
time. python/Cargo.toml's "feature mirror" turns those features on; this script lists what it
misses, as `package version: features`, so that the line can be added. Exit status is 0 either
way: a stale mirror costs build time, not correctness.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

FORMAT = ["-f", "{p} [{f}]", "--prefix", "none", "--locked", "--quiet"]


def feature_sets(args: list[str]) -> dict[tuple[str, str], set[str]]:
    """(name, version) -> the feature lists the package is built with (host and target)."""
    out = subprocess.run(
        ["cargo", "tree", *args, *FORMAT], check=True, capture_output=True, text=True
    ).stdout
    sets: dict[tuple[str, str], set[str]] = defaultdict(set)
    for line in out.splitlines():
        line = line.replace(" (*)", "").replace(" (proc-macro)", "")
        if line.count(" ") < 2:
            continue  # the blank line between the trees of several roots
        name, version, rest = line.split(" ", 2)
        # Workspace members print their path before the features.
        features = rest[rest.rfind("[") :]
        sets[(name, version)].add(features)
    return sets


def main() -> int:
    workspace = feature_sets(["--workspace", "-e", "normal,build,dev"])
    python = feature_sets(["-p", "spate-python", "-e", "normal,build"])
    stale = [
        (key, sorted(workspace.get(key, set())))
        for key, features in sorted(python.items())
        if features != workspace.get(key)
    ]
    if not stale:
        print("python/Cargo.toml's feature mirror matches the workspace")
        return 0
    print(
        "warning: python/Cargo.toml's feature mirror is stale; maturin will rebuild these "
        "(and what depends on them). Add their workspace features to the mirror:",
        file=sys.stderr,
    )
    for (name, version), features in stale:
        print(f"  {name} {version}: {' or '.join(features)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
