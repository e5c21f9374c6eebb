# The test planner (coa-rewards, plan.rs): reads a JSON list of tasks' assert-style test code on
# stdin and writes the list of their plans, one JSON object each. It runs as a trusted process outside every sandbox and executes
# nothing: the code is only parsed (ast), constants only read (ast.literal_eval).
#
# {"calls": [{"req": the driver's request (plain.py's `lit`), "shown": "f(args)",
#             "checks": [{"eq": v} | {"is": null/true/false} | {"truthy": bool}
#                        | {"near": v, "tol": t, "strict": bool} | {"isclose": v, "rel": r, "abs": a}]}]}
# with values encoded as plain.py does.
# when every statement is one the grader can decide from (arguments, result) pairs:
#   assert candidate(ARGS) == V          (or V == candidate(ARGS), `is None/True/False`)
#   assert candidate(ARGS) / not candidate(ARGS)
#   assert abs(candidate(ARGS) - V) < TOL   (<=, either order inside abs)
#   assert math.isclose(candidate(ARGS), V, rel_tol=R, abs_tol=A)
#   NAME = candidate(ARGS) then asserts on NAME (LiveCodeBench: result = Solution().m(ARGS))
# inside `def check(candidate)` followed by `check(ENTRY)`, or at the top level, with literal
# ARGS and V; imports, docstrings, `pass`, `assert True` and literal constants (METADATA) are
# allowed around them. Otherwise {"remote": [names], "why": reason}: the names the code reads
# without defining them (the program's functions), for a checker process.

import ast
import builtins
import json
import sys

enc, _, lit = _coa_plain()


class Unplannable(Exception):
    pass


def value(node):
    try:
        v = ast.literal_eval(node)
        enc(v)
        return v
    except Exception:
        raise Unplannable('line %d: not a plain literal' % node.lineno)


def plain(v):
    # A value as the plan's JSON carries it.
    return json.loads(enc(v))


def literal(node):
    return plain(value(node))


def free_names(tree):
    bound, loaded = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split('.')[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    return sorted(loaded - bound)


class Planner:
    def __init__(self):
        self.calls = []
        self.results = {}  # NAME -> index of the call it holds
        self.candidate = None  # check's parameter name
        self.entry = None

    def call(self, node):
        # A call of the program's: candidate(ARGS), NAME(ARGS) or Class().method(ARGS).
        if not isinstance(node, ast.Call):
            return None
        f = node.func
        if isinstance(f, ast.Name) and f.id not in vars(builtins):
            path = ['\0candidate'] if f.id == self.candidate else [f.id]
        elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name)
              and not f.value.args and not f.value.keywords):
            path = [f.value.func.id, f.attr]
        else:
            return None
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise Unplannable('line %d: starred arguments' % node.lineno)
        args, kwargs = [value(a) for a in node.args], {k.arg: value(k.value) for k in node.keywords}
        target = '%s().%s' % tuple(path) if len(path) == 2 else path[0]
        shown = ', '.join([repr(a)[:60] for a in args] + ['%s=%s' % (k, repr(v)[:60]) for k, v in kwargs.items()])
        self.calls.append({'path': path, 'args': args, 'kwargs': kwargs, 'shown': '%s(%s)' % (target, shown), 'checks': []})
        return len(self.calls) - 1

    def result(self, node):
        # The index of the call whose result `node` is: a call, or a name holding one.
        if isinstance(node, ast.Name) and node.id in self.results:
            return self.results[node.id]
        return self.call(node)

    def check(self, at, check):
        self.calls[at]['checks'].append(check)

    def assertion(self, test):
        if isinstance(test, ast.Constant):
            if test.value:
                return
            raise Unplannable('line %d: an assertion that always fails' % test.lineno)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            at = self.result(test.operand)
            if at is not None:
                return self.check(at, {'truthy': False})
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left, op, right = test.left, test.ops[0], test.comparators[0]
            if isinstance(op, ast.Eq):
                at = self.result(left)
                value = right
                if at is None:
                    at, value = self.result(right), left
                if at is not None:
                    return self.check(at, {'eq': literal(value)})
            if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (None, True, False):
                at = self.result(left)
                if at is not None:
                    return self.check(at, {'is': right.value})
            if isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call) and isinstance(left.func, ast.Name) \
                    and left.func.id == 'abs' and len(left.args) == 1 and not left.keywords \
                    and isinstance(left.args[0], ast.BinOp) and isinstance(left.args[0].op, ast.Sub):
                a, b = left.args[0].left, left.args[0].right
                at, value = self.result(a), b
                if at is None:
                    at, value = self.result(b), a
                if at is not None:
                    return self.check(at, {'near': literal(value), 'tol': literal(right), 'strict': isinstance(op, ast.Lt)})
        if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr == 'isclose' \
                and isinstance(test.func.value, ast.Name) and test.func.value.id == 'math' and len(test.args) == 2:
            tol = {k.arg: k.value for k in test.keywords}
            if set(tol) <= {'rel_tol', 'abs_tol'}:
                at, value = self.result(test.args[0]), test.args[1]
                if at is None:
                    at, value = self.result(test.args[1]), test.args[0]
                if at is not None:
                    return self.check(at, {'isclose': literal(value),
                                           'rel': literal(tol['rel_tol']) if 'rel_tol' in tol else plain(1e-09),
                                           'abs': literal(tol['abs_tol']) if 'abs_tol' in tol else plain(0.0)})
        at = self.result(test)
        if at is not None:
            return self.check(at, {'truthy': True})
        raise Unplannable('line %d: an assertion the grader cannot decide from a call and a literal' % test.lineno)

    def statement(self, node):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Pass)):
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return  # a docstring
        if isinstance(node, ast.Assert):
            return self.assertion(node.test)
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            at = self.call(node.value)
            if at is not None:
                self.results[node.targets[0].id] = at
                return
        raise Unplannable('line %d: a statement other than an assertion on a call' % node.lineno)

    def module(self, tree):
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == 'check' and self.candidate is None \
                    and len(node.args.args) == 1 and not node.decorator_list:
                self.candidate = node.args.args[0].arg
                for inner in node.body:
                    self.statement(inner)
                self.results = {}
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) \
                    and node.value.func.id == 'check' and self.candidate is not None and self.entry is None \
                    and len(node.value.args) == 1 and isinstance(node.value.args[0], ast.Name) and not node.value.keywords:
                self.entry = node.value.args[0].id
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and not isinstance(node.value, ast.Call):
                literal(node.value)  # METADATA = {...}
            else:
                self.statement(node)
        if self.candidate is not None and self.entry is None:
            raise Unplannable('check(candidate) is never called')
        if not self.calls:
            raise Unplannable('no call to check')
        planned = []
        for c in self.calls:
            if not c['checks']:
                raise Unplannable('a call whose result is never checked')
            path = [self.entry] if c['path'] == ['\0candidate'] else c['path']
            shown = c['shown'].replace('\0candidate', self.entry or 'candidate', 1)
            planned.append({'req': lit(path, c['args'], c['kwargs']), 'shown': shown, 'checks': c['checks']})
        return planned


def plan(source):
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError) as e:
        return {'remote': [], 'why': 'the tests do not parse: %s' % e}
    try:
        return {'calls': Planner().module(tree)}
    except (Unplannable, RecursionError) as e:
        return {'remote': free_names(tree), 'why': str(e)}


# A JSON list of test texts in, the list of their plans out: one process plans a whole table.
json.dump([plan(source) for source in json.load(sys.stdin)], sys.stdout)
