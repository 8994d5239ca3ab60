"""The layout's rules, checked on the source: no import cycle in specserve/ but the drafter
registry's self-registration, no function over 60 lines but the named declarative tables, no file
over 400 lines, and one module that changes the target cache's row lengths."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "specserve"
TABLES = set()                    # (module, function) of declarative tables allowed to be long
DRAFTER_REGISTRY = "specserve.drafters"


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        mod = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        out[mod.removesuffix(".__init__")] = p
    return out


def imports(mod: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """Modules of specserve that ``mod`` imports, anywhere (under TYPE_CHECKING too: a type-only import
    back is still a cycle of design)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {t for t in [node.module] + [f"{node.module}.{a.name}" for a in node.names] if t in known}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
    return out - {mod}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_but_the_drafter_registry():
    mods = modules()
    graph = {m: imports(m, p, set(mods)) for m, p in mods.items()}
    for comp in strongly_connected(graph):
        # the registry imports every drafter module to register it; each imports the package's base
        assert all(m == DRAFTER_REGISTRY or m.startswith(DRAFTER_REGISTRY + ".") for m in comp), sorted(comp)
        assert f"{DRAFTER_REGISTRY}.registry" in comp, sorted(comp)


def test_no_long_function_or_file():
    long = []
    for mod, p in modules().items():
        src = p.read_text()
        if len(src.splitlines()) > 400:
            long.append(f"{p}: {len(src.splitlines())} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 60 and (mod, node.name) not in TABLES:
                    long.append(f"{p}:{node.lineno} {node.name}: {n} lines")
    assert not long, "\n".join(long)


def test_one_module_changes_the_target_caches_lengths():
    """Only the row table sets a row's length or compacts a cache, or writes a length (the KV cache
    defines the methods)."""
    writers = set()
    for mod, p in modules().items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("set_length", "compact"):
                writers.add(mod)
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute) and t.value.attr == "lengths":
                        writers.add(mod)
    assert writers <= {"specserve.engine.rows", "specserve.models.kv_cache"}, sorted(writers)
