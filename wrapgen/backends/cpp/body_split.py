"""Split the emitted host function into pieces g++ compiles in linear time.

`run_program` is one long straight-line function. g++ compiles it in time that grows faster
than its length even at -O0 (register allocation and the exception cleanups of hundreds of
`wrapgen::Tensor` locals in one function): a GPT-2 backward's 3,700 lines took 7.2 s of g++,
of which 2.8 s register allocation. Cut into pieces of a few dozen statements, each run as an
immediately called lambda `[&]() { ... }();`, the same code compiles in 2.6 s, and runs the
same: the lambdas capture the function's locals by reference.

A local that a later piece reads must outlive its piece, so its declaration moves out of the
lambda into the function, just before the piece: `wrapgen::Tensor t_x = f();` becomes
`wrapgen::Tensor t_x;` there and `t_x = f();` inside. Only declarations of types known to be
default-constructible and assignable move (`HOISTED_TYPES`); any other statement that declares
a name at the function's top level (an RAII guard, a static, a reference) stays in the function
between two pieces, where it keeps its scope; so does every statement holding `return`, which
inside a lambda would leave only the lambda. Declarations keep their order relative to those
statements, so destructors run in the order they did.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# Statements per piece: small enough that no piece is slow to compile, large enough that the
# lambdas themselves cost little (20 compiled slower than 40; 40 to 150 within 10%).
STATEMENTS_PER_PIECE = 40

HOISTED_TYPES = ("wrapgen::Tensor", "wrapgen::Value", "int64_t", "double", "bool")
_HOISTABLE = re.compile(
    r"^(?:const\s+)?(?P<type>" + "|".join(re.escape(t) for t in HOISTED_TYPES) + r")\s+(?P<name>[A-Za-z_]\w*)"
    r"(?:\s*=\s*(?P<init>.+))?;(?P<comment>\s*(?://.*|/\*.*\*/))?$"
)
# A statement that declares a name: type (maybe qualified, templated, pointer or reference),
# then an identifier, then an initializer, arguments, an array bound or the end.
_DECLARES = re.compile(
    r"^(?:(?:static|const|constexpr|thread_local)\s+)*[A-Za-z_][\w:]*(?:\s*<.*>)?[\s*&]+[A-Za-z_]\w*\s*(?:=|\(|\{|\[|;)"
)
_CONTROL = re.compile(r"\b(?:return|goto)\b")


def _code_only(text: str) -> str:
    """`text` with string and character literals emptied and comments removed."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _statements(lines: list[str]) -> Iterator[list[str]]:
    """The top-level statements of a function body, each as its lines (a block with its body)."""
    group: list[str] = []
    depth = 0
    for number, line in enumerate(lines):
        group.append(line)
        code = _code_only(line).strip()
        depth += code.count("{") - code.count("}")
        if depth > 0 or (code and not code.endswith((";", "}"))) or code.startswith("#"):
            if code.startswith("#") and depth == 0:
                yield group  # a preprocessor line stands alone
                group = []
            continue
        following = _code_only(lines[number + 1]).strip() if number + 1 < len(lines) else ""
        if following.startswith(("else", "catch", "while")):
            continue  # the statement goes on
        yield group
        group = []
    if group:
        yield group


def _top_level_comma(text: str) -> bool:
    depth = 0
    for c in _code_only(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            return True
    return False


def _hoist(statement: list[str]) -> tuple[str, str | None] | None:
    """(declaration, assignment or None) for a one-line declaration that may move out of a
    piece; None for any other statement."""
    if len(statement) != 1:
        return None
    match = _HOISTABLE.match(statement[0].strip())
    if match is None:
        return None
    kind, name, init = match["type"], match["name"], match["init"]
    declaration = f"{kind} {name}{{}};"
    if init is None:
        return declaration, None
    if _top_level_comma(init):
        return None  # `int64_t a = 1, b = 2;`: more than one name
    return declaration, f"{name} = {init};{match['comment'] or ''}"


def _stays_outside(statement: list[str]) -> bool:
    """Whether a statement must run in the function itself: it declares a name the hoisting
    cannot move, is a preprocessor line, or returns."""
    text = "\n".join(statement)
    code = _code_only(text).strip()
    if code.startswith("#") or _CONTROL.search(code):
        return True
    first = _code_only(statement[0]).strip()
    return bool(_DECLARES.match(first)) and not first.startswith(("else", "do ", "do{"))


def _split_blocks(statement: list[str], per_piece: int) -> list[str]:
    """A block statement with the statements inside each of its bodies split in turn (a CUDA
    graph region holds a whole program in its recording branch)."""
    if len(statement) <= per_piece:
        return statement
    out: list[str] = []
    run: list[str] = []
    depth = 0
    for line in statement:
        code = _code_only(line).strip()
        if depth >= 1 and not (depth == 1 and code.startswith("}")):
            run.append(line)  # inside a body of the block
        else:
            out.extend(split_into_pieces(run, per_piece))  # a body ends (or none began)
            run = []
            out.append(line)
        depth += code.count("{") - code.count("}")
    out.extend(split_into_pieces(run, per_piece))
    return out


def split_into_pieces(lines: list[str], per_piece: int | None = None) -> list[str]:
    """`lines` (the statements of a function body) with their runs of `per_piece` statements
    (default `STATEMENTS_PER_PIECE`) wrapped in immediately called lambdas, and the bodies of
    long block statements split alike; a body of at most `per_piece` statements unchanged."""
    per_piece = STATEMENTS_PER_PIECE if per_piece is None else per_piece
    statements = [_split_blocks(s, per_piece) if len(s) > 1 else s for s in _statements(lines)]
    if len(statements) <= per_piece:
        return [line for statement in statements for line in statement]
    out: list[str] = []
    declarations: list[str] = []
    piece: list[str] = []
    count = 0

    def flush() -> None:
        nonlocal count
        out.extend(declarations)
        declarations.clear()
        if count > 1:
            out.append("[&]() {")
            out.extend("  " + line for line in piece)
            out.append("}();")
        else:
            out.extend(piece)  # one statement: no lambda needed
        piece.clear()
        count = 0

    for statement in statements:
        hoisted = _hoist(statement)
        if hoisted is not None:
            declaration, assignment = hoisted
            declarations.append(declaration)
            if assignment is not None:
                piece.append(assignment)
                count += 1
        elif _stays_outside(statement):
            flush()
            out.extend(statement)
            continue
        else:
            piece.extend(statement)
            count += 1 if _code_only("\n".join(statement)).strip() else 0
        if count >= per_piece:
            flush()
    flush()
    return out


__all__ = ["HOISTED_TYPES", "STATEMENTS_PER_PIECE", "split_into_pieces"]
