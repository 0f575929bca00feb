"""What the house-rule tests read of a module's source: its string constants that are neither docstrings nor help
texts (argparse ``help=`` keywords, dataclass ``metadata={"help": ...}``), and its identifiers."""

from __future__ import annotations

import ast
from pathlib import Path


def _prose(tree: ast.AST) -> set[int]:
    prose = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            prose.add(id(node.value))  # docstrings and bare string statements
        if isinstance(node, ast.keyword) and node.arg == "help":
            prose.update(id(child) for child in ast.walk(node.value))
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "help":
                    prose.update(id(child) for child in ast.walk(value))
    return prose


def code_strings(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every string constant of the module at ``path`` that is not prose."""
    tree = ast.parse(path.read_text())
    prose = _prose(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
    ]


def identifiers(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of every name, attribute and keyword argument of the module at ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.keyword) and node.arg:
            found.append((node.lineno, node.arg))
    return found
