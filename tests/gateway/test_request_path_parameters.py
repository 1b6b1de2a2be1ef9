"""No function in llmgw.gateway takes more than MAX_PARAMETERS parameters: a request's steps pass one value
(`RequestContext`, `Ledger`, `RoutingFacts`) instead of a dozen arguments.

The walk covers every function and method of every module under llmgw/gateway (the whole package, not only the
request path), read with `ast`. Parameters are counted as Python declares them: positional, keyword-only, `*args`
and `**kwargs`; a method's `self` or `cls` is not counted. Two constructors are allowed more, by name: they are
the control plane's interface to the gateway (`Gateway(store, table, ...)`, `GatewayWorkers(...)`), called once per
process with keyword options, never on the request path.
"""

from __future__ import annotations

import ast
from pathlib import Path

import llmgw.gateway

MAX_PARAMETERS = 6
CONSTRUCTORS = {("app.py", "Gateway.__init__"), ("workers.py", "GatewayWorkers.__init__")}
PACKAGE = Path(llmgw.gateway.__file__).parent


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function in `tree`, methods as Class.name, nested ones as outer.inner."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The parameter names of `node` in declaration order, without `self` and `cls`."""
    args = node.args
    declared = (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg)
    names = [a.arg for a in declared if a is not None]
    return [name for name in names if name not in ("self", "cls")]


def _too_many() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        for name, node in _functions(ast.parse(path.read_text(), str(path))):
            count = len(_parameters(node))
            if count > MAX_PARAMETERS and (relative, name) not in CONSTRUCTORS:
                found.append(f"{relative}:{node.lineno} {name} takes {count} parameters")
    return found


def test_no_function_in_the_gateway_takes_more_than_six_parameters():
    assert _too_many() == []


def test_the_walk_sees_every_module_and_counts_as_python_declares():
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    assert {"app.py", "proxying.py", "upstream.py", "routing.py", "request_context.py"} <= modules
    tree = ast.parse("class C:\n    def m(self, a, /, b, *c, d, **e): pass\n"
                     "async def f(a, b=1, *, c): \n    def inner(x): pass\n")
    found = {name: _parameters(node) for name, node in _functions(tree)}
    assert found == {"C.m": ["a", "b", "c", "d", "e"], "f": ["a", "b", "c"], "f.inner": ["x"]}
    # the allowed constructors exist (a rename must not silently widen the exception)
    names = {(p.relative_to(PACKAGE).as_posix(), n) for p in PACKAGE.rglob("*.py")
             for n, _ in _functions(ast.parse(p.read_text()))}
    assert CONSTRUCTORS <= names
