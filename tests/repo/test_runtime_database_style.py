"""One runtime database style: runtime code queries Postgres through asyncpg only.

SQLAlchemy (and Alembic, which runs on it) stays where it is the schema and its migrations.
The modules allowed to import them, and why:

* ``controlplane.db.models``: the schema, as SQLAlchemy models; Alembic compares against it.
* ``controlplane.db.migrate``: Alembic upgrades through a SQLAlchemy engine, made there for
  an upgrade and disposed of after it.
* ``controlplane.db.migrations`` and below: Alembic's environment and the revisions.
* ``controlplane.db.urls``: parses and rewrites ``DATABASE_URL`` with SQLAlchemy's URL class
  (the DSN for asyncpg, the URL for Alembic's engine, the redacted one for logs); no query
  runs through it.

Everything else (HTTP, console, CLI, loops) uses ``controlplane.db.pool``. Checked on
grimp's import graph (what lint-imports builds on), not by searching the text.
"""

from __future__ import annotations

import grimp
import pytest

ORM_PACKAGES = ("sqlalchemy", "alembic")
ALLOWED = frozenset({"controlplane.db.models", "controlplane.db.migrate", "controlplane.db.urls"})
ALLOWED_PACKAGES = ("controlplane.db.migrations",)


def _allowed(module: str) -> bool:
    return module in ALLOWED or any(
        module == package or module.startswith(package + ".") for package in ALLOWED_PACKAGES
    )


def offenders(graph: grimp.ImportGraph, package: str) -> list[str]:
    """Modules of ``controlplane`` that import ``package`` directly, and may not."""
    return sorted(
        module
        for module in graph.find_modules_that_directly_import(package)
        if module.startswith("controlplane") and not _allowed(module)
    )


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("controlplane", include_external_packages=True)


@pytest.mark.parametrize("package", ORM_PACKAGES)
def test_only_the_schema_and_migrations_import_the_orm(
    graph: grimp.ImportGraph, package: str
) -> None:
    found = offenders(graph, package)
    assert not found, (
        f"{', '.join(found)} import {package}: runtime code queries through asyncpg "
        "(controlplane.db.pool); see this test's docstring for where the ORM may be used"
    )


def test_the_allowed_modules_are_still_the_ones_that_use_it(graph: grimp.ImportGraph) -> None:
    """The allowance names real modules that do use SQLAlchemy: a stale entry would let a
    new module of that name through unnoticed."""
    importers = graph.find_modules_that_directly_import("sqlalchemy")
    assert importers >= ALLOWED, sorted(ALLOWED - importers)


def test_a_runtime_module_importing_sqlalchemy_is_named() -> None:
    """The check catches what it is for: a made-up graph with one runtime module too many."""
    made_up = grimp.ImportGraph()
    for importer in ("controlplane.db.models", "controlplane.db.migrations.env"):
        made_up.add_import(importer=importer, imported="sqlalchemy")
    made_up.add_import(importer="controlplane.console.devices", imported="sqlalchemy")
    made_up.add_import(importer="controlplane.console.devices", imported="asyncpg")
    assert offenders(made_up, "sqlalchemy") == ["controlplane.console.devices"]
