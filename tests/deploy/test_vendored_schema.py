"""Argo's schema is vendored, unchanged and licensed, and the schema checks read that copy:
they run in the hosted CI as here, with nothing beside the checkout."""

from __future__ import annotations

import hashlib
import re

from tests.deploy.schemas import ARGO_SCHEMA, REPO, validate_definition
from tests.workflows import argo_schema


def test_the_vendored_schema_is_the_documented_file_with_its_license():
    folder = ARGO_SCHEMA.parent
    assert folder.is_relative_to(REPO) and argo_schema.SCHEMA_PATH == ARGO_SCHEMA
    (digest,) = re.findall(r"sha256 `([0-9a-f]{64})`", (folder / "README.md").read_text())
    assert hashlib.sha256(ARGO_SCHEMA.read_bytes()).hexdigest() == digest
    assert "Apache License" in (folder / "LICENSE").read_text()


def test_both_checks_use_it():
    assert argo_schema.validator("Workflow") is not None
    validate_definition({"name": "x", "containerPort": 80}, "io.k8s.api.core.v1.ContainerPort")
