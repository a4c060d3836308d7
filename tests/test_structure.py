"""The shape of the code itself: what a reader of ``tpsim/`` may rely on (issue: one contract, one way).

- no import cycle between tpsim modules (counting imports inside functions too: a lazy import that only
  keeps a circle from failing is still a circle);
- no file in ``tpsim/`` over 300 lines and no function over 60;
- the pure-arithmetic modules (formulas, memory, link presets, the model config) import without MPI, so a
  planner runs on a laptop with nothing but NumPy;
- no module outside the architecture registry (``tpsim/arch/``) branches on an architecture's name or sniffs
  which config it holds: what differs between architectures is data or a method reached through the registry;
- the article the teaching material follows is cited by name, never as "the seed";
- a layer carries no feature-named slot: features hook in through the generic hooks (``tpsim.nn.hooks``).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tpsim"
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The tpsim modules ``path`` imports, anywhere in the file: ``from a.b import c`` counts as ``a.b.c`` when
    that is a module, else ``a.b``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in modules:
            for a in node.names:
                out.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    mods = sources()
    graph = {name: imports_of(path, set(mods)) - {name} for name, path in mods.items()}
    circles = cycles(graph)
    assert not circles, "import circles (modules that import each other):\n" + "\n".join(map(str, circles))


def room(module: str) -> str:
    """The part of tpsim a module belongs to: its package under ``tpsim`` (``tpsim.plan``), or itself when it is a
    top-level module (``tpsim.config`` is a package, ``tpsim.cost`` a module)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_import_runs_back_up_between_the_parts_of_tpsim():
    """The packages and top-level modules of tpsim stand in floors, each above all it imports: no two of them import
    each other, directly or round a loop (a type named only for a checker counts too). A loop between parts is an
    import that runs back up; the message names the parts and one import of each."""
    mods = sources()
    graph: dict[str, set[str]] = {}
    why: dict[tuple[str, str], str] = {}
    for name, path in mods.items():
        for target in imports_of(path, set(mods)):
            a, b = room(name), room(target)
            if a != b:
                graph.setdefault(a, set()).add(b)
                why.setdefault((a, b), f"{name} -> {target}")
            graph.setdefault(b, set())
    circles = cycles(graph)
    lines = [f"{c}: " + "; ".join(why[a, b] for a in c for b in c if (a, b) in why) for c in circles]
    assert not circles, "parts of tpsim that import each other:\n" + "\n".join(lines)


def test_no_file_over_300_lines_and_no_function_over_60():
    long_files = [f"{p.relative_to(ROOT)}: {n}" for p in sources().values()
                  if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    long_functions = []
    for path in sources().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n}")
    assert not long_files, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(long_files)
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long_functions)


@pytest.mark.parametrize("modules", [
    "tpsim.predict.formulas, tpsim.predict.memory, tpsim.predict.hardware, tpsim.arch.gpt2",
    "tpsim.cost, tpsim.errors, tpsim.phases, tpsim.partition, tpsim.compare, tpsim.table, tpsim.plotting, tpsim.nn",
    "tpsim.kinds, tpsim.trace.kind_split",
    "tpsim.live_pipeline.split, tpsim.live_pipeline.clock, tpsim.predict.pipeline_comm, tpsim.pipeline.schedules",
    "tpsim.paths, tpsim.atomic, tpsim.npzfile, tpsim.rank_grid, tpsim.options, tpsim.links, tpsim.gpus",
    "tpsim.arch, tpsim.config, tpsim.arch.llama, tpsim.predict.llama_memory, tpsim.predict.model_state",
    "tpsim.plan.cli, tpsim.plan.planner, tpsim.plan.search, tpsim.plan.published, tpsim.plan.validate",
    "tpsim.hf.config, tpsim.hf.weights, tpsim.hf.layout, tpsim.generate.argmax, tpsim.generate.kv_cache, "
    "tpsim.generate.report",
    "tpsim.pipeline, tpsim.pipeline.schedules, tpsim.pipeline.check, tpsim.pipeline.clock, tpsim.pipeline.grid, "
    "tpsim.pipeline.figure, tpsim.schedule_cli, tpsim.predict.pipeline, tpsim.plan.schedule",
])
def test_pure_arithmetic_imports_without_mpi(modules):
    code = f"import sys, {modules}; assert 'mpi4py' not in sys.modules, 'mpi4py was imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# Not yet through the registry: the demo's argument handling, being rewritten into one run configuration
# (issue 21, item 2). Remove a file from here once it no longer branches; the test fails while it is stale.
def arch_branches(path: Path) -> list[str]:
    """Where ``path`` asks which architecture it holds: a comparison with a registered name or alias (``arch ==
    "llama"``, ``kind in ("gpt", "gpt2")``), an ``is_llama``-style helper, ``hasattr`` on a field only some
    configs have, ``isinstance`` against a config class."""
    from tpsim.arch import ARCH_SPELLINGS, ARCHITECTURES

    names = set(ARCH_SPELLINGS)
    classes = {a.config.__name__ for a in ARCHITECTURES.values()}
    fields = [set(a.config.__dataclass_fields__) for a in ARCHITECTURES.values()]
    some_fields = set().union(*fields) - set.intersection(*fields)

    def strings(node) -> set[str]:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}

    def called(node) -> str:
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""

    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Compare) and any(strings(n) & names for n in (node.left, *node.comparators)):
            out.append(f"{where}: compares with an architecture's name")
        elif isinstance(node, (ast.FunctionDef, ast.Name)) and getattr(node, "name", getattr(node, "id", "")) in (
                "is_llama", "is_gpt", "is_gpt2"):
            out.append(f"{where}: is_<architecture>")
        elif isinstance(node, ast.Call) and called(node) == "hasattr" and len(node.args) == 2 \
                and strings(node.args[1]) & some_fields:
            out.append(f"{where}: hasattr on a field only some configs have")
        elif isinstance(node, ast.Call) and called(node) == "isinstance" and len(node.args) == 2 \
                and {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} & classes:
            out.append(f"{where}: isinstance against a config class")
    return out


def test_no_module_outside_the_registry_branches_on_an_architecture():
    arch = PACKAGE / "arch"
    found = {str(p.relative_to(ROOT)): arch_branches(p) for p in sources().values() if arch not in p.parents}
    branching = [hit for hits in found.values() for hit in hits]
    assert not branching, ("branches on an architecture's name (make it data or a method of the config or its "
                           "tpsim.arch entry):\n" + "\n".join(branching))


# The words that name a parallel axis or its machinery. A name or string counts when one of its ``_``-separated words
# is one of these (``cp_size``, ``self.region``, ``"tp"``); "partition" is not one: a serial layer's parameters
# carry a ``Partition`` and its heads ``heads_per_partition``, which serially is every head.
AXIS_WORDS = {"context", "cp", "tp", "dp", "pp", "ep", "sp", "zero", "region", "group", "rank", "world", "comm",
              "replicas", "pipeline", "parallel", "ring", "ulysses", "mpi"}


def axis_branches(source: str, name: str) -> list[str]:
    """Where the module ``source`` (called ``name`` in the messages) asks which parallel layout it runs under: an ``if``, a conditional expression, a ``while``
    or a comprehension's ``if`` whose test names a parallel axis (``AXIS_WORDS``), and any ``context`` attribute
    (read, assigned, or by name through ``getattr``/``setattr``/``hasattr``)."""
    def words(node) -> set[str]:
        text = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
            node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
        return set(re.split(r"[^a-z0-9]+", text.lower()))

    out = []
    for node in ast.walk(ast.parse(source)):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        tests = [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else \
            node.ifs if isinstance(node, ast.comprehension) else []
        for test in tests:
            named = set().union(*(words(n) for n in ast.walk(test))) & AXIS_WORDS
            if named:
                out.append(f"{where}: branches on {', '.join(sorted(named))}")
        if isinstance(node, ast.Attribute) and node.attr == "context" or isinstance(node, ast.Call) and any(
                isinstance(a, ast.Constant) and a.value == "context" for a in node.args[1:2]):
            out.append(f"{where}: a context attribute")
    return out


def test_no_parallel_axis_is_asked_about_inside_nn():
    """The serial layers (``tpsim/nn/``) never ask which parallel layout they run under (issue 36: parallel features
    injected, not patched): what differs is an object they are given at construction — a TP layer's ``Region``,
    an attention layer's core (``tpsim.nn.attention.AttentionCore``; context parallelism's is
    ``tpsim.cp.context.ContextParallel``) — and they call it without asking which it is. So no ``if`` in ``nn``
    names an axis, and no ``context`` slot is left there to be filled in after the build."""
    found = [hit for p in sorted((PACKAGE / "nn").rglob("*.py"))
             for hit in axis_branches(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "tpsim/nn asks about a parallel axis (give the layer an object instead):\n" + "\n".join(found)


def test_the_axis_rule_sees_a_branch():
    """The rule above finds what it is meant to: a context slot, a region test, a CP branch, a TP-named string."""
    text = ("class A:\n    def __init__(self):\n        self.context = None\n"
            "    def f(self, x, cp_size, kind):\n        if self.region.splits_sequence:\n            pass\n"
            "        y = x if cp_size == 1 else -x\n        return [v for v in x if kind == 'tp']\n")
    hits = axis_branches(text, "probe.py")
    assert len(hits) == 4, hits


# "eq. (1) of the seed", "seed §3.1", "the seed's eq. (3)": the article's old nickname. The RNG seed keeps its name.
ARTICLE_AS_SEED = re.compile(r"seed\s*§|seed['’]s\s+(eq|§|section)|(eq\.?|equation|§)\s*\(?[\d.]+\)?\s+(of|in)\s+the\s+seed",
                             re.IGNORECASE)


def test_the_article_is_cited_by_name():
    docs = [p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts]
    paths = [*PACKAGE.rglob("*.py"), *(ROOT / "lessons").rglob("*.py"), ROOT / "README.md", *docs]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in paths
            for i, line in enumerate(p.read_text().splitlines(), 1) if ARTICLE_AS_SEED.search(line)]
    assert not hits, "cite the SenseParrots article (or the paper) by name:\n" + "\n".join(hits)


def test_no_test_file_name_is_in_both_suites():
    """``tests/`` and ``tests/mpi/`` have no ``__init__.py``, so pytest imports each file by its bare name: a name in
    both would make one ``pytest --collect-only tests`` fail. A multi-rank twin carries its own name."""
    one = {p.name for p in (ROOT / "tests").glob("*.py")}
    every_rank = {p.name for p in (ROOT / "tests" / "mpi").glob("*.py")} - {"conftest.py"}
    assert not one & every_rank, f"in both tests/ and tests/mpi/: {sorted(one & every_rank)}"


# A layer knows no training feature: a feature (the DP sync's overlap, ZeRO's waits, gathers and reductions) acts
# through the generic hooks every Module keeps (``tpsim.nn.hooks``), the way FSDP2 rides on PyTorch's pre/post
# hooks. What a Module may hold besides, with why:
MODULE_CLASS_ATTRIBUTES = {"inline"}  # a layout fact of the layer (its children named as its parent's)
MODULE_INSTANCE_ATTRIBUTES = {"params", "grads", "partition", "path",
                              "hooks",  # the one generic list
                              "deferral"}  # the B/W split of the contract itself, set by deferred_weight_grads only
FEATURE_SLOTS = {"grad_ready", "params_wait", "grads_needed", "params_use"}  # the slots the hooks replaced


def test_module_has_no_feature_named_slot():
    from tpsim.nn.module import Module

    data = {name for name, value in vars(Module).items()
            if not name.startswith("__") and not callable(value) and not isinstance(value, (property, staticmethod,
                                                                                          classmethod))}
    assert data <= MODULE_CLASS_ATTRIBUTES, f"class attributes of Module beyond those allowed: " \
                                            f"{sorted(data - MODULE_CLASS_ATTRIBUTES)}"
    held = set(vars(Module()))
    assert held == MODULE_INSTANCE_ATTRIBUTES, f"a bare Module holds {sorted(held)}, expected " \
                                               f"{sorted(MODULE_INSTANCE_ATTRIBUTES)}"


def slot_writes(path: Path) -> list[str]:
    """Where ``path`` sets or deletes a feature slot on an object (``mod.params_use = ...``, ``del mod.x``,
    ``setattr(mod, "x", ...)``, ``mod.__dict__.pop("x")``), sets ``deferral`` outside ``tpsim/nn/module.py``, or
    rewires another object's ``launch`` / ``finish`` (a ``GradSync`` takes its ``Reduction`` at construction)."""
    here = path.relative_to(ROOT)
    banned = FEATURE_SLOTS | ({"deferral"} if here != Path("tpsim/nn/module.py") else set())
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        flat = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        for t in flat:
            if isinstance(t, ast.Attribute) and (t.attr in banned or (
                    t.attr in ("launch", "finish") and not (isinstance(t.value, ast.Name) and t.value.id == "self"))):
                out.append(f"{here}:{node.lineno}: sets {t.attr}")
        if isinstance(node, ast.Call):
            f = node.func
            by_name = (f.id in ("setattr", "delattr") if isinstance(f, ast.Name) else isinstance(f, ast.Attribute)
                       and f.attr == "pop" and isinstance(f.value, ast.Attribute) and f.value.attr == "__dict__")
            words = {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
            if by_name and words & banned:
                out.append(f"{here}:{node.lineno}: sets or pops {sorted(words & banned)} by name")
    return out


def test_no_code_sets_a_feature_slot_on_a_layer():
    hits = [hit for path in sources().values() for hit in slot_writes(path)]
    assert not hits, ("a layer's behaviour set from outside it (register a tpsim.nn.hooks.Hook instead; give a "
                      "GradSync its Reduction):\n" + "\n".join(hits))


# ZeRO's stage is data (``tpsim.zero_stage``: what is sharded, when the gradients are reduced and the parameters
# gathered), chosen once; code asks ``stage.shards_params``, not ``zero >= 3``. Where a comparison is about the
# number itself, with why (file: how many):
STAGE_NUMBER_ALLOWED = {
    "tpsim/plan/layout.py": 2,  # a layout's --zero checked against the stages the planner prices
    "tpsim/plan/report.py": 1,  # " ZeRO-2" printed in a layout's name
    "tpsim/demo/resume.py": 1,  # " ZeRO-2" printed in a resumed run's description
    "tpsim/figures/plan.py": 1,  # " Z1" in a figure's label
}
STAGE_NUMBER_NAMES = {"zero", "zero_stage"}


def stage_number_tests(source: str, name: str) -> list[str]:
    """Where ``source`` asks for ZeRO's stage by its number: a comparison with ``zero``/``zero_stage`` (a name, an
    attribute, ``x["zero"]``, ``getattr(x, "zero_stage", 0)``) on either side, or one of them tested for truth
    (``if lay.zero:``, ``x if par.zero else y``, ``par.zero and dp > 1``, ``not zero``)."""
    def number(node) -> bool:
        if isinstance(node, ast.Name):
            return node.id in STAGE_NUMBER_NAMES
        if isinstance(node, ast.Attribute):
            return node.attr in STAGE_NUMBER_NAMES
        if isinstance(node, ast.Subscript):
            return isinstance(node.slice, ast.Constant) and node.slice.value in STAGE_NUMBER_NAMES
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in STAGE_NUMBER_NAMES)

    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(number(n) for n in (node.left, *node.comparators)):
            out.add(node.lineno)
        truth = ([node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else node.ifs
                 if isinstance(node, ast.comprehension) else node.values if isinstance(node, ast.BoolOp) else
                 [node.operand] if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) else [])
        out.update(t.lineno for t in truth if number(t))
    return [f"{name}:{line}" for line in sorted(out)]


def test_zero_stage_is_asked_as_data_not_by_number():
    """ZeRO's stage is chosen once as data (issue 36): no code compares its number (``zero == 2``, ``lay.zero <
    3``, ``if par.zero:``) beyond ``STAGE_NUMBER_ALLOWED``, where printing or checking the number is the point.
    Before ``tpsim.zero_stage`` this rule found 70 such lines in tpsim/; 5 are left, all allowed above. A new one
    asks the stage instead (``run.parallel.zero_stage.shards_grads``,
    ``zero_of(optimizer).reduces_every_microbatch``)."""
    over = []
    for path in sources().values():
        here = str(path.relative_to(ROOT))
        hits = stage_number_tests(path.read_text(), here)
        if len(hits) > STAGE_NUMBER_ALLOWED.get(here, 0):
            over.append(f"{here}: {len(hits)} (allowed {STAGE_NUMBER_ALLOWED.get(here, 0)}): " + ", ".join(hits))
    assert not over, ("ZeRO's stage compared by number (ask tpsim.zero_stage.ZeroStage's fields: "
                      "Parallelism.zero_stage, tpsim.train.protocol.zero_of):\n" + "\n".join(over))


def test_the_stage_number_rule_sees_a_comparison():
    """The rule above finds what it is meant to, and not a field of the stage."""
    text = ("def f(lay, par, sync, w):\n    a = 1 if lay.zero >= 3 else 2\n    if par.zero:\n        pass\n"
            "    b = getattr(sync, 'zero_stage', 0) in (1, 2)\n    c = w['zero'] == 2 and not par.zero_stage\n"
            "    return lay.zero_stage.shards_params and par.zero_stage.gathers_after_step\n")
    assert stage_number_tests(text, "probe.py") == ["probe.py:2", "probe.py:3", "probe.py:5", "probe.py:6"]
