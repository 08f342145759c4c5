"""The ``pg`` and ``slow`` markers, put on every collected test by ``tests/conftest.py``.

No test marks itself (an explicit ``@pytest.mark.slow`` still works, and is kept): the marks
follow from what the test's code reaches, so a new test is marked the day it is written.

``pg``: the test needs Postgres. It uses a fixture in ``PG_FIXTURES`` (every database
fixture of ``tests/conftest.py`` builds on ``pg_server_url``, and ``item.fixturenames`` is
the transitive closure of what a test requests), or code it reaches starts a Postgres of its
own (anything from ``pgserver``, or the embedded Postgres's ``controlplane.db.embedded_process``).

``slow``: the test starts processes: code it reaches calls one of ``_spawners()``, the
standard library's ways to start a process (``subprocess``, ``asyncio``'s subprocesses,
``os.fork``/``posix_spawn``/``exec*``/``system``, ``pty``, process pools), or uses
``multiprocessing`` or Playwright (which starts Chromium).

"Code it reaches" is found statically, at collection, from the bytecode: the test function
and every fixture function in its closure are read, each name they load is resolved as
Python would (globals, builtins, ``a.b.c`` by attribute, imports inside the function
included), and each function or class it resolves to that is ours (defined under
``tests/``, ``controlplane/``, ``endpointd/`` or ``shared/``) is read the same way,
transitively. A class counts as a whole, with its base classes: one method that starts a
process makes every user of the class slow. Annotations are not code, so naming
``subprocess.Popen`` in one does not count. So a helper that runs ``subprocess.run`` marks
exactly the tests that call it, wherever it lives, and so does product code run in-process
(the zygote, the daemon's command starter, the desktop notification of an approval).

Not followed: cached functions (``functools.cache``/``lru_cache``: a probe that runs once a
process, like ``git --list-cmds``), this module, code reached only dynamically
(``request.getfixturevalue``, a method of an object whose class no reached code names), and
third-party libraries, whose own probes (``platform.processor()`` runs ``uname``,
``ctypes.util.find_library`` runs ``ldconfig``) are one-off and quick.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import dis
import functools
import inspect
import os
import pty
import subprocess
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = tuple(REPO / d for d in ("tests", "controlplane", "endpointd/endpointd", "shared"))
"""Where the code is that ``reach`` follows."""

PG_FIXTURES = frozenset({"pg_server_url"})
"""Fixtures that are, or start, the suite's Postgres (the others request one of these)."""

SPAWNING_MODULES = ("multiprocessing", "playwright")
"""Packages any use of which starts a process (as a dotted-name prefix)."""
PG_MODULES = ("pgserver", "controlplane.db.embedded_process")
"""Packages any use of which starts a Postgres (the embedded one runs the wheel's binaries
without importing it)."""
SPAWNING_METHODS = frozenset({"subprocess_exec", "subprocess_shell"})
"""Method names that start a process on whatever object (an event loop's)."""


@functools.cache
def _spawners() -> frozenset[object]:
    found: set[object] = {
        subprocess.Popen,
        subprocess.run,
        subprocess.call,
        subprocess.check_call,
        subprocess.check_output,
        subprocess.getoutput,
        subprocess.getstatusoutput,
        asyncio.create_subprocess_exec,
        asyncio.create_subprocess_shell,
        concurrent.futures.ProcessPoolExecutor,
        pty.fork,
        pty.spawn,
    }
    prefixes = ("exec", "spawn", "posix_spawn", "fork")
    for name in dir(os):
        if name.startswith(prefixes) or name in ("system", "popen"):
            found.add(getattr(os, name))
    return frozenset(found)


@dataclass
class Reach:
    """What running some code leads to: starting processes, needing Postgres."""

    spawns: bool = False
    pg: bool = False

    def add(self, other: Reach) -> None:
        self.spawns |= other.spawns
        self.pg |= other.pg


def _module_of(obj: object) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    module = getattr(obj, "__module__", None)
    return module if isinstance(module, str) else ""


def _starts_with(module: str, packages: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _classify_module(module: str) -> Reach:
    """What importing or using anything from ``module`` does by itself."""
    return Reach(spawns=_starts_with(module, SPAWNING_MODULES), pg=_starts_with(module, PG_MODULES))


def _classify(obj: object) -> Reach:
    """What using ``obj`` (resolved from a name) does by itself."""
    try:
        found = _classify_module(_module_of(obj))
        found.spawns |= obj in _spawners()
    except Exception:  # unhashable, or an object that fails on any attribute: not a spawner
        return Reach()
    return found


@functools.cache
def _is_ours(filename: str) -> bool:
    path = Path(filename).resolve()
    return path != Path(__file__).resolve() and any(path.is_relative_to(d) for d in OURS)


def _our_code(obj: object) -> types.FunctionType | type | None:
    """``obj`` unwrapped, if it is a function or class of ours (see ``OURS``)."""
    if inspect.ismethod(obj):
        obj = obj.__func__
    if isinstance(obj, functools.partial):
        obj = obj.func
    try:
        if hasattr(obj, "cache_info"):  # functools.cache/lru_cache: a probe, once per process
            return None
        if not inspect.isclass(obj):  # decorated (functools.wraps, contextmanager...)
            obj = inspect.unwrap(obj)  # type: ignore[arg-type]
    except Exception:  # a wrapper cycle, or an object that fails on any attribute
        return None
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return None
    try:
        filename = inspect.getfile(obj)
    except TypeError:  # built-in
        return None
    return obj if _is_ours(filename) else None


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and the code nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _used_by_function(function: types.FunctionType) -> tuple[Reach, list[object]]:
    """What a function's bytecode uses: modules it imports, and the objects it names.

    Read from the bytecode rather than the source: what a name refers to is resolved as
    Python would (globals, then builtins; ``a.b.c`` by attribute), imports inside the
    function count, and annotations are not code (decorators and default values are the
    enclosing code's).
    """
    itself = Reach()
    used: list[object] = []
    namespace = function.__globals__
    for code in _code_objects(function.__code__):
        local: dict[str, object] = {}  # names an import in this code object bound
        chain: object = _NOTHING  # the object the instructions so far load
        imported: object = _NOTHING  # the module an import statement left on the stack
        previous: object = None
        for instruction in dis.get_instructions(code):
            op, arg = instruction.opname, instruction.argval
            if op in ("LOAD_GLOBAL", "LOAD_NAME"):
                chain = namespace.get(arg, vars(builtins).get(arg, _NOTHING))
            elif op in ("LOAD_FAST", "LOAD_DEREF") and arg in local:
                chain = local[arg]
            elif op in ("LOAD_ATTR", "LOAD_METHOD"):
                itself.spawns |= arg in SPAWNING_METHODS
                if chain is not _NOTHING:
                    chain = _getattr(chain, arg)
            elif op == "IMPORT_NAME":
                itself.add(_classify_module(arg))
                # with a from-list the statement gets the module itself, else its package
                name = arg if isinstance(previous, tuple) else arg.partition(".")[0]
                chain = imported = sys.modules.get(name, _NOTHING)
            elif op == "IMPORT_FROM":
                chain = _getattr(imported, arg) if imported is not _NOTHING else _NOTHING
            elif op.startswith("STORE_") and chain is not _NOTHING:
                local[arg] = chain
            else:
                chain = _NOTHING
            if chain is not _NOTHING and op.startswith(("LOAD_", "IMPORT_")):
                used.append(chain)
            previous = arg
    return itself, used


def _used_by_class(cls: type) -> list[object]:
    """A class is used whole: its base classes, and everything defined in its body."""
    used: list[object] = list(cls.__mro__[1:])
    for value in vars(cls).values():
        if isinstance(value, staticmethod | classmethod):
            used.append(value.__func__)
        elif isinstance(value, property):
            used.extend(f for f in (value.fget, value.fset, value.fdel) if f is not None)
        else:
            used.append(value)
    return used


class _Nothing:
    """What an instruction loads when it cannot be known statically."""


_NOTHING = _Nothing()


def _getattr(obj: object, name: str) -> object:
    try:
        return getattr(obj, name)
    except Exception:  # a property may raise anything: not knowable statically
        return _NOTHING


@dataclass
class _Node:
    """One function or class of ours: what it does itself, and the code of ours it uses."""

    code: types.FunctionType | type
    itself: Reach
    uses: list[types.FunctionType | type]


_NODES: dict[int, _Node] = {}


def _node(code: types.FunctionType | type) -> _Node:
    if id(code) in _NODES:
        return _NODES[id(code)]
    if isinstance(code, type):
        itself, used = Reach(), _used_by_class(code)
    else:
        itself, used = _used_by_function(code)
    node = _NODES[id(code)] = _Node(code, itself, [])
    seen: set[int] = set()
    for target in used:
        node.itself.add(_classify(target))
        ours = _our_code(target)
        if ours is not None and id(ours) not in seen:
            seen.add(id(ours))
            node.uses.append(ours)
    return node


_REACH: dict[int, Reach] = {}


def reach(obj: object) -> Reach:
    """What running ``obj`` (a function or class of ours) leads to, transitively.

    The code reached is a graph with cycles (functions calling each other, a class and its
    methods' helpers): its strongly connected components share one result, found with
    Tarjan's algorithm (iteratively: the graph is deep).
    """
    start = _our_code(obj)
    if start is None:
        return Reach()
    if id(start) in _REACH:
        return _REACH[id(start)]
    index: dict[int, int] = {id(start): 0}
    low: dict[int, int] = {id(start): 0}
    stack: list[_Node] = [_node(start)]
    on_stack: set[int] = {id(start)}
    work: list[tuple[_Node, Iterator[types.FunctionType | type]]] = [
        (stack[0], iter(stack[0].uses))
    ]
    while work:
        current, uses = work[-1]
        key = id(current.code)
        for used in uses:
            if id(used) in _REACH:
                continue
            if id(used) not in index:
                index[id(used)] = low[id(used)] = len(index)
                stack.append(_node(used))
                on_stack.add(id(used))
                work.append((stack[-1], iter(stack[-1].uses)))
                break
            if id(used) in on_stack:
                low[key] = min(low[key], index[id(used)])
        else:
            work.pop()
            if work:
                parent = id(work[-1][0].code)
                low[parent] = min(low[parent], low[key])
            if low[key] == index[key]:
                component: list[_Node] = []
                while not component or id(component[-1].code) != key:
                    component.append(stack.pop())
                    on_stack.discard(id(component[-1].code))
                found = Reach()
                for member in component:
                    found.add(member.itself)
                    for used in member.uses:
                        if id(used) in _REACH:
                            found.add(_REACH[id(used)])
                for member in component:
                    _REACH[id(member.code)] = found
    return _REACH[id(start)]


def _fixture_functions(item: pytest.Function) -> Iterator[Callable[..., object]]:
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        for definition in definitions:
            yield definition.func


def mark(item: pytest.Item) -> None:
    """Add ``pg`` and ``slow`` to ``item`` when its code calls for them (see the module)."""
    if not isinstance(item, pytest.Function):
        return
    found = reach(item.function)
    for function in _fixture_functions(item):
        found.add(reach(function))
    if found.pg or PG_FIXTURES.intersection(item.fixturenames):
        item.add_marker(pytest.mark.pg)
    if found.spawns and item.get_closest_marker("slow") is None:
        item.add_marker(pytest.mark.slow)
