"""The import-linter contract type "imports_only": a package imports nothing but the standard library and the
modules its contract names. pyproject.toml ([tool.importlinter]) uses it for the collection's parts; `make lint`
runs every contract with `lint-imports`.

import-linter's own contract types name what must not be imported (``forbidden``) or who may import a module
(``protected``); none says "only these", which is the collection's rule (a module_utils file ships to the
nodes, where there is only Python: DESIGN.md, "The parts and the dependency rule"). A contract type of one's
own is import-linter's way to add a rule (https://import-linter.readthedocs.io/en/stable/custom_contract_types.html).
External packages are in the graph by their top-level name (``include_external_packages``), so the standard
library is recognised by that name (``sys.stdlib_module_names``).
"""

from __future__ import annotations

import sys

import grimp
from importlinter import Contract, ContractCheck, fields, output

STANDARD_LIBRARY = frozenset(sys.stdlib_module_names) | {"__future__"}


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


class ImportsOnlyContract(Contract):
    """``source_modules`` and their descendants import only the standard library and ``allowed_modules`` (each
    with its descendants; an external package by its top-level name, as the graph holds it)."""

    type_name = "imports_only"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    allowed_modules = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        allowed = tuple(self.allowed_modules)  # type: ignore[arg-type]
        found = []
        for source in self.source_modules:  # type: ignore[attr-defined]
            if source.name not in graph.modules:
                raise ValueError(f"Module '{source.name}' does not exist.")
            for importer in sorted({source.name} | graph.find_descendants(source.name)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if imported.split(".")[0] in STANDARD_LIBRARY or _within(imported, allowed):
                        continue
                    lines = sorted(detail["line_number"]
                                   for detail in graph.get_import_details(importer=importer, imported=imported))
                    found.append({"importer": importer, "imported": imported, "line_numbers": lines})
        return ContractCheck(kept=not found, metadata={"imports": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for item in check.metadata["imports"]:
            lines = ", ".join(f"l.{n}" for n in item["line_numbers"]) or "l.?"
            output.print_error(f"{item['importer']} is not allowed to import {item['imported']} ({lines})",
                               bold=False)
        output.new_line()
