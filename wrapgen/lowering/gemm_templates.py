"""max_autotune: library matrix products become GEMM template kernels with their epilogue fused.

Runs on the lowered lines before kernels are placed (`KernelGraphLowering.finish_body`). With
`max_autotune` every `aten::mm/addmm/bmm.out` call of static sizes is a candidate; without it,
on CUDA (`misaligned_gemm_templates`), only the products cuBLAS serves with its unaligned
kernels: a leading dimension that is not a multiple of 16 bytes (GPT-2's vocabulary of 50257
makes its LM head 3-6x slower than a Triton tile that stores under a mask), in half precision
(or float32 with TF32 allowed), measured against a shortlist of three template configurations.
On CUDA (`skinny_gemm_templates`), products of at most 16 rows over a large weight (batch-1
decoding) are measured against the skinny matrix-vector template too.
For each candidate it finds the pointwise fusion group that is
the product's only reader, reading it at the very element the product holds (bias, GELU,
residual add, scaling, a cast: the epilogue). The tuner (`kernels.templates`) measures the
library call against template instances with that epilogue; when a template wins, the call
and the epilogue's kernel are replaced by one `KernelDefinition` + `KernelCall`, placed where
the epilogue's kernel would have run, the measured candidates in the definition's metadata.
When the library wins, a comment line before the call records the measurement.
"""

from __future__ import annotations

import random

import sympy
import torch

from wrapgen import config
from wrapgen.loop_ir import Load, loads, node_loads, row_vars, walk
from wrapgen.lowering.scheduler import FusionGroup, schedule
from wrapgen.wrapper_ir.lines import Allocate, Comment, ExternKernel, KernelCall, KernelDefinition, WrapperLine
from wrapgen.wrapper_ir.values import TensorRef, TensorType

GEMM_OPS = {"aten::mm.out": "mm", "aten::addmm.out": "addmm", "aten::bmm.out": "bmm"}
# below this many multiply-adds an unaligned cuBLAS kernel costs a few microseconds: not worth
# compiling and measuring candidates for (without max_autotune)
MISALIGNED_MIN_MACS = 1 << 22
TEMPLATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# a skinny product's weight below this many elements is read in a few microseconds by any kernel
SKINNY_MIN_WEIGHT = 1 << 18


def apply_gemm_templates(lowering, lines: list[WrapperLine], pending_type: type) -> list[WrapperLine]:
    """`lines` with the matrix products that a template instance serves best replaced by it."""
    tune_all = config.max_autotune and lowering.language in ("cpp", "triton")
    on_cuda = lowering.language == "triton" and torch.device(lowering.device).type == "cuda"
    misaligned_only = not tune_all and config.misaligned_gemm_templates and on_cuda
    skinny_only = not tune_all and config.skinny_gemm_templates and on_cuda
    if not (tune_all or misaligned_only or skinny_only):
        return lines
    backends = None if tune_all else "aten,template"  # the library call is always measured too
    shortlist = not tune_all  # a misaligned product only: the few configurations that win, not all
    types = _types_with_fixed_layouts(lowering)
    products = []
    for line in lines:
        if isinstance(line, ExternKernel) and line.op in GEMM_OPS:
            parts = _problem(line, types, lowering.device)
            if parts is not None and (tune_all or (misaligned_only and _worth_measuring_unaligned(parts))
                                      or (skinny_only and _worth_measuring_skinny(parts))):
                products.append((line, parts))
    if not products:
        return lines
    from wrapgen.kernels.templates import precompile, select_gemm
    from wrapgen.kernels.templates.triton_skinny import skinny
    from wrapgen.kernels.templates.triton_skinny_group import groupable, select_group

    lines = list(lines)
    groups = _groups(lowering, lines, pending_type)
    names = [f"{lowering.language}_template_{parts['op']}_{number}" for number, (_, parts) in enumerate(products)]
    # The epilogues as the lines stand now (a rewrite below can take a later product's readers,
    # which then compiled for nothing): every product's candidates compile in one batch.
    precompile([(_epilogue_problem(extern, parts, lines, groups, lowering, pending_type, types)[0], name)
                for (extern, parts), name in zip(products, names)], lowering.language, backends, shortlist)
    definitions: list[WrapperLine] = []
    shared: dict[tuple, str] = {}  # products of the same code (a chain of identical layers) share a kernel
    siblings: dict[tuple, list[tuple]] = {}  # skinny products of one A, placed after the loop (grouped or not)
    for (extern, problem_parts), name in zip(products, names):
        problem, group = _epilogue_problem(extern, problem_parts, lines, groups, lowering, pending_type, types)
        try:
            selection = select_gemm(problem, lowering.language, name, backends, shortlist)
        except NotImplementedError:  # an epilogue the template cannot render: the product alone
            group = None
            problem = _make_problem(problem_parts, None, frozenset(), lowering, types)
            selection = select_gemm(problem, lowering.language, name, backends, shortlist)
        if lowering.language == "triton" and group is None and skinny(problem) and groupable(problem):
            siblings.setdefault((problem.a, problem.m, problem.k), []).append((extern, problem, selection, name))
            continue
        lines = _place(lines, extern, group, selection, lowering, pending_type, definitions, shared)
    for run in (r for found in siblings.values() for r in _sibling_runs(found, lines, lowering.mutations.root)):
        grouped = None
        times = [selection.milliseconds for _, _, selection, _ in run]
        if len(run) > 1 and None not in times:
            grouped = select_group([problem for _, problem, _, _ in run], f"{run[0][3]}_group", sum(times))
        if grouped is None or grouped.kernel is None:
            if grouped is not None:  # the measurement that kept them apart
                lines.insert(lines.index(run[0][0]), Comment(grouped.summary))
            for extern, _, selection, _ in run:
                lines = _place(lines, extern, None, selection, lowering, pending_type, definitions, shared)
            continue
        kernel = grouped.kernel
        metadata = (("device", str(lowering.device)), *((k, v) for k, v in kernel.metadata if k != "device"),
                    ("template", "triton_skinny_group"), ("autotune", grouped.summary))
        name = _definition(kernel, metadata, lowering, definitions, shared)
        call = KernelCall(name, tuple(TensorRef(t) for t in kernel.tensors), kernel.grid, kernel.written)
        last = run[-1][0]
        lines = [call if line is last else line for line in lines if line is last or all(line is not e for e, *_ in run)]
    return definitions + lines


def _place(lines, extern, group, selection, lowering, pending_type, definitions, shared) -> list[WrapperLine]:
    """`lines` with the product's selection applied: the template's call (and its definition), or
    a comment with the measurement before the library call."""
    if selection.kernel is None:
        lines.insert(lines.index(extern), Comment(selection.summary))
        return lines
    kernel = selection.kernel
    metadata = (("device", str(lowering.device)), *((k, v) for k, v in kernel.metadata if k != "device"),
                ("template", selection.choice), ("autotune", selection.summary))
    name = _definition(kernel, metadata, lowering, definitions, shared)
    call = KernelCall(name, tuple(TensorRef(t) for t in kernel.tensors), kernel.grid, kernel.written)
    return _rewrite(lines, extern, group, call, lowering, pending_type)


def _definition(kernel, metadata: tuple, lowering, definitions: list, shared: dict) -> str:
    """The kernel's name, or that of an earlier one of the same code (a chain of identical layers)."""
    same_code = (kernel.source.replace(kernel.name, "KERNEL"), metadata[:-1])  # the summary aside
    name = shared.setdefault(same_code, kernel.name)
    if name == kernel.name:
        definitions.append(KernelDefinition(kernel.name, lowering.language, kernel.source, metadata))
    return name


def _sibling_runs(found: list[tuple], lines: list[WrapperLine], root) -> list[list[tuple]]:
    """`found` (skinny products of one A, in program order) split into runs that one launch at
    the last one's place may compute: no line between reads an earlier product of the run, or
    writes the storage of A or of a weight the run reads (`root`: a buffer's storage)."""
    runs: list[list[tuple]] = []
    position = {id(line): i for i, line in enumerate(lines)}
    for item in found:
        run = runs[-1] if runs else None
        if run is not None:
            outputs = {p.out.name for _, p, _, _ in run}
            operands = {root(p.a.name) for _, p, _, _ in run} | {root(p.b.name) for _, p, _, _ in [*run, item]}
            between = lines[position[id(run[0][0])] + 1:position[id(item[0])]]
            if all(any(line is e for e, *_ in run) or isinstance(line, Allocate)
                   or not (outputs & set(line.uses()) or operands & {root(w) for w in getattr(line, "writes", ())})
                   for line in between):
                run.append(item)
                continue
        runs.append([item])
    return runs


def _epilogue_problem(extern, parts: dict, lines, groups, lowering, pending_type, types) -> tuple:
    """(the product with the pointwise group that consumes it as its epilogue, that group), or
    the product alone and None where the problem cannot take that epilogue."""
    group, needed = _epilogue(extern, parts, lines, groups, lowering, pending_type)
    try:
        return _make_problem(parts, group, needed, lowering, types), group
    except NotImplementedError:
        return _make_problem(parts, None, frozenset(), lowering, types), None


def misaligned(parts: dict) -> bool:
    """Whether cuBLAS would run an unaligned kernel for this product: a stride (other than 1, of a
    dimension longer than 1) of an operand or the output is not a multiple of 16 bytes."""
    for key in ("a", "b", "out"):
        sizes, strides, dtype = parts["layouts"][parts[key][0]]
        width = max(1, 16 // dtype.itemsize)
        if any(st % width for size, st in zip(sizes, strides) if size > 1 and st != 1):
            return True
    return False


def _worth_measuring_unaligned(parts: dict) -> bool:
    """Without max_autotune: a misaligned product large enough to matter, in a dtype whose
    template dot runs on the tensor cores (half precision, or float32 where TF32 is allowed).
    A float32 dot at IEEE precision runs at a fraction of cuBLAS's rate even against its
    unaligned kernels: on GPT-2's four LM-head products the library won every time, so
    compiling templates for them only lengthened the compile (benchmarks/results/
    gemm-shortlist-cuda-2026-11-26-H200.md)."""
    dtype = parts["a"][1]
    tensor_cores = dtype in (torch.bfloat16, torch.float16) or (
        dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32)
    return tensor_cores and misaligned(parts) and _macs(parts) >= MISALIGNED_MIN_MACS


def _worth_measuring_skinny(parts: dict) -> bool:
    """Without max_autotune: a product of a few rows (batch-1 decoding) over a weight large enough
    that its read, not the launch, sets the time: measured against the skinny template, which
    spreads the weight's columns over every SM where cuBLAS's tiles use a few
    (kernels/templates/triton_skinny.py)."""
    from wrapgen.kernels.templates.triton_skinny import SKINNY_MAX_ROWS

    return (parts["op"] in ("mm", "addmm") and parts["m"] <= SKINNY_MAX_ROWS
            and parts["n"] * parts["k"] >= SKINNY_MIN_WEIGHT)


def _macs(parts: dict) -> int:
    return parts["batch"] * parts["m"] * parts["n"] * parts["k"]


def _groups(lowering, lines: list[WrapperLine], pending_type: type) -> list[FusionGroup]:
    """The fusion groups the kernels will have (the same schedule `finish_body` makes)."""
    position = {line.name: i for i, line in enumerate(lines) if isinstance(line, pending_type)}
    readers: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        for used in line.uses():
            readers.setdefault(used, []).append(i)
    order = sorted(lowering.compute.values(), key=lambda n: position[n.name])
    return schedule(order, position, readers)


def _types_with_fixed_layouts(lowering) -> dict[str, TensorType]:
    """Every buffer's type, with the strides the program fixed for a library result whose line
    leaves them to the library (an element of a tuple result, checked at run time by an
    `EnsureStrides` line): kernels index such a buffer at those strides, so a template and
    the tuner's stand-ins read it at them too."""
    from wrapgen.lowering.graph_lowering import Buffer

    types = dict(lowering._known_types())
    for value in lowering.values.values():
        for v in value if isinstance(value, tuple) else (value,):
            known = types.get(v.name) if isinstance(v, Buffer) else None
            if known is not None and known.strides is None and v.fixed_layout and v.type.strides is not None:
                types[v.name] = v.type
    return types


def _static(values) -> tuple[int, ...] | None:
    """Constant sizes or strides (None when any is symbolic, or when they are unknown)."""
    if values is None:
        return None
    out = []
    for v in values:
        v = sympy.sympify(v)
        if not v.is_Integer:
            return None
        out.append(int(v))
    return tuple(out)


def _problem(extern: ExternKernel, types: dict[str, TensorType], device: torch.device) -> dict | None:
    """The product's operands as (batch, row, column) strides, or None when no template applies."""
    op = GEMM_OPS[extern.op]
    kwargs = dict(extern.kwargs)
    out = kwargs.get("out")
    args = list(extern.args)
    if not isinstance(out, TensorRef) or not all(isinstance(a, TensorRef) for a in args[: 3 if op == "addmm" else 2]):
        return None
    alpha, beta = kwargs.get("alpha", 1), kwargs.get("beta", 1)
    if op == "addmm":
        beta, alpha = (args[3] if len(args) > 3 else beta), (args[4] if len(args) > 4 else alpha)
    if not isinstance(alpha, (int, float)) or not isinstance(beta, (int, float)) or isinstance(alpha, bool):
        return None
    names = [a.name for a in args[: 3 if op == "addmm" else 2]]
    bias_name = names.pop(0) if op == "addmm" else None
    layouts = {}
    for name in [*names, out.name, *([bias_name] if bias_name else [])]:
        t = types.get(name)
        if t is None or t.device != device:
            return None
        sizes, strides = _static(t.sizes), _static(t.strides)
        if sizes is None or strides is None or len(sizes) != len(strides):
            return None
        layouts[name] = (sizes, strides, t.dtype)
    (a_sizes, a_strides, a_dtype), (b_sizes, b_strides, b_dtype) = layouts[names[0]], layouts[names[1]]
    out_sizes, out_strides, out_dtype = layouts[out.name]
    if a_dtype != b_dtype or a_dtype not in TEMPLATE_DTYPES or out_dtype != a_dtype:
        return None
    if op == "bmm":
        batch, m, k = a_sizes
        n = b_sizes[2]
        a3, b3, o3 = a_strides, b_strides, out_strides
    else:
        (m, k), n, batch = a_sizes, b_sizes[1], 1
        a3, b3, o3 = (0, *a_strides), (0, *b_strides), (0, *out_strides)
    if min(batch, m, n, k) < 1:
        return None
    bias3 = None
    if bias_name is not None:
        sizes, strides, dtype = layouts[bias_name]
        if len(sizes) > 2 or dtype not in TEMPLATE_DTYPES:
            return None
        full = (1,) * (2 - len(sizes)) + sizes
        st = (0,) * (2 - len(strides)) + strides
        bias3 = (0, *(0 if size == 1 else s for size, s in zip(full, st)))
    return {"op": op, "batch": batch, "m": m, "n": n, "k": k, "a": (names[0], a_dtype, a3), "b": (names[1], b_dtype, b3),
            "out": (out.name, out_dtype, o3), "bias": (bias_name, layouts[bias_name][2], bias3) if bias_name else None,
            "alpha": float(alpha), "beta": float(beta), "layouts": layouts}


def _epilogue(extern, parts: dict, lines, groups, lowering, pending_type) -> tuple[FusionGroup | None, frozenset]:
    """The pointwise group that is the product's only reader, and which of its members are needed."""
    product = parts["out"][0]
    readers = [line for line in lines if product in line.uses() and line is not extern]
    if not readers or not all(isinstance(r, pending_type) for r in readers):
        return None, frozenset()
    group = next((g for g in groups if readers[0].name in g.names()), None)
    if group is None or group.reduced or any(m.level != "row" for m in group.members):
        return None, frozenset()
    rows = (parts["batch"], parts["m"], parts["n"]) if parts["op"] == "bmm" else (parts["m"], parts["n"])
    group_rows = _static(group.rows)
    if group_rows is None or any(r.name not in group.names() for r in readers):
        return None, frozenset()
    strides = parts["out"][2][1:] if parts["op"] != "bmm" else parts["out"][2]
    if group_rows != rows:
        # a linear layer on 3-D input: the product [b*t, n] is read back as a view [b, t, n]
        from wrapgen.kernels.templates.problem import dense_strides

        flat = 1
        for s in group_rows[:-1]:
            flat *= s
        if parts["op"] == "bmm" or group_rows[-1] != parts["n"] or flat != parts["m"] or strides != (parts["n"], 1):
            return None, frozenset()
        strides = dense_strides(group_rows)
        rows = group_rows
    element = sympy.expand(sum(v * s for v, s in zip(row_vars(len(rows)), strides)))
    for m in group.members:
        if m.node.store_indirect or any(isinstance(b, Load) and b.indirect for b in walk(m.node.body)):
            return None, frozenset()
        for ld in loads(m.node.body):
            if ld.buffer == product and not same_element(ld.index, element, rows):
                return None, frozenset()
        if _static(m.node.rows) is None:
            return None, frozenset()
    members = group.names()
    needed = set()
    for line in lines:
        if isinstance(line, pending_type) and line.name in members:
            continue
        needed |= members & set(line.uses())
    return group, frozenset(needed)


def same_element(index: sympy.Expr, element: sympy.Expr, rows: tuple[int, ...]) -> bool:
    """Whether `index` reads the product at `element` for every point of `rows`. A view's index
    keeps floor divisions and moduli that only its ranges make trivial (x2 // 96 is 0 for
    x2 < 96), so when the difference does not vanish symbolically it is evaluated at the
    domain's corners, along every axis, and at random points."""
    difference = sympy.expand(index - element)
    if difference == 0:
        return True
    variables = row_vars(len(rows))
    if difference.free_symbols - set(variables):
        return False
    rng = random.Random(0)
    points = [tuple(rng.randrange(s) for s in rows) for _ in range(32)]
    points += [tuple(0 if (mask >> d) & 1 == 0 else s - 1 for d, s in enumerate(rows)) for mask in range(2 ** len(rows))]
    for d, s in enumerate(rows):
        step = max(1, s // 256)
        points += [tuple(v if e == d else 0 for e in range(len(rows))) for v in range(0, s, step)]
    for point in points:
        if difference.xreplace(dict(zip(variables, map(sympy.Integer, point)))) != 0:
            return False
    return True


def _make_problem(parts: dict, group, needed, lowering, types):
    from wrapgen.kernels.templates.problem import Epilogue, GemmProblem, Operand

    layouts = dict(parts["layouts"])
    epilogue = None
    if group is not None:
        dtypes = lowering._buffer_dtypes()
        epilogue = Epilogue(group, needed, dtypes)
        for m in group.members:
            for name in [ld.buffer for ld in node_loads(m.node)] + [m.node.name]:
                t = types.get(name)
                if name in layouts or name == parts["out"][0] or t is None:
                    continue
                sizes, strides = _static(t.sizes), _static(t.strides)
                if sizes is None or strides is None or len(sizes) != len(strides):
                    raise NotImplementedError(f"an epilogue reading {name}, whose layout is only known at run time")
                layouts[name] = (sizes, strides, t.dtype)
    bias = Operand(*parts["bias"]) if parts["bias"] else None
    operands = [parts["a"][0], parts["b"][0], *([parts["bias"][0]] if parts["bias"] else [])]
    return GemmProblem(parts["op"], parts["batch"], parts["m"], parts["n"], parts["k"], Operand(*parts["a"]),
                       Operand(*parts["b"]), Operand(*parts["out"]), bias, parts["alpha"], parts["beta"],
                       str(lowering.device), epilogue, layouts, _weights(lowering, operands, layouts))


def _weights(lowering, names: list[str], layouts: dict) -> dict[str, torch.Tensor]:
    """The operands among `names` that are views of the program's constants (its weights), as
    views of the real tensors: the tuner reads them in place instead of allocating a stand-in
    copy (an LM head's weight is tens of MiB, more than the call itself may need)."""
    from wrapgen.lowering.graph_lowering import Buffer

    constants = getattr(lowering.captured, "constants", {})
    roots: dict[str, torch.Tensor] = {}
    buffers: dict[str, Buffer] = {}
    for node, value in lowering.values.items():
        if not isinstance(value, Buffer):
            continue
        buffers[value.name] = value
        if getattr(node, "name", None) in constants:
            roots[value.name] = constants[node.name][1]
    out = {}
    for name in names:
        buffer = buffers.get(name)
        root = roots.get(buffer.root) if buffer is not None else None
        offset = sympy.sympify(buffer.root_offset) if buffer is not None else None
        if root is None or not offset.is_Integer:
            continue
        sizes, strides, dtype = layouts[name]
        if root.dtype != dtype or root.device != torch.device(lowering.device) or root.is_meta:
            continue
        extent = root.untyped_storage().nbytes() // root.element_size()
        start = root.storage_offset() + int(offset)
        if all(sizes) and start + sum((s - 1) * st for s, st in zip(sizes, strides)) >= extent:
            continue
        out[name] = root.detach().as_strided(sizes, strides, start)
    return out


def _rewrite(lines, extern, group, call: KernelCall, lowering, pending_type) -> list[WrapperLine]:
    """Replace the library call (and the epilogue's compute nodes) by the template's call."""
    if group is None:
        return [call if line is extern else line for line in lines]
    members = group.names()
    product = dict(extern.kwargs)["out"].name
    allocations = {line.name: line for line in lines if isinstance(line, Allocate) and line.name in members}
    last = max(i for i, line in enumerate(lines) if isinstance(line, pending_type) and line.name in members)
    out: list[WrapperLine] = []
    for i, line in enumerate(lines):
        if i == last:
            out += [allocations[w] for w in call.writes if w in allocations]
            out.append(call)
        elif line is extern or (isinstance(line, Allocate) and (line.name == product or line.name in members)):
            continue
        elif isinstance(line, pending_type) and line.name in members:
            continue
        else:
            out.append(line)
    for name in members:
        lowering.compute.pop(name, None)
    return out
