"""House rules of the library's layout that a reader relies on."""

import ast
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1] / "fedjax_lab"


def _length(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def test_no_library_function_is_over_80_lines_unless_its_length_is_its_closures():
    """A long function is read in one sitting only if it is an optax-style factory: the functions it defines
    and returns make up most of it (``component_round``, Feddle's ``coefficient_search``)."""
    long = []
    for path in sorted(LIBRARY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and _length(node) > 80:
                inner = sum(_length(n) for n in node.body if isinstance(n, ast.FunctionDef))
                if inner < _length(node) / 2:
                    long.append(f"{path.relative_to(LIBRARY)}:{node.lineno} {node.name} "
                                f"({_length(node)} lines, {inner} in closures)")
    assert not long, long
