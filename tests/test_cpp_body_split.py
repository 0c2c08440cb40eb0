"""The C++ run function cut into lambdas (`wrapgen/backends/cpp/body_split.py`): declarations move
out of the pieces, guards, statics and returns stay in the function, blocks stay whole; and
models compiled with tiny pieces (every statement boundary a cut) run as eager does."""

from __future__ import annotations

import pytest
import torch

import wrapgen
from tests import test_cpp_backend as cpp_cases
from tests import test_end_to_end as e2e
from wrapgen.backends.cpp import body_split
from wrapgen.backends.cpp.body_split import split_into_pieces


def test_a_short_body_is_left_as_it_is() -> None:
    lines = ["wrapgen::Tensor t_a = f();", "g(t_a);", "return;"]
    assert split_into_pieces(lines, per_piece=3) == lines


def test_declarations_move_out_of_the_pieces_and_assignments_stay_in() -> None:
    lines = [
        "const int64_t s0 = t_x.size(0);",
        "wrapgen::Tensor t_a = wrapgen::empty_strided({s0}, {1}, 6, 1, -1);  // a comment",
        "wrapgen::Value t_v;",
        "k0(t_a.data_ptr(), s0);",
        "t_x.reset();",
        "return;",
    ]
    assert split_into_pieces(lines, per_piece=2) == [
        "int64_t s0{};",
        "wrapgen::Tensor t_a{};",
        "[&]() {",
        "  s0 = t_x.size(0);",
        "  t_a = wrapgen::empty_strided({s0}, {1}, 6, 1, -1);  // a comment",
        "}();",
        "wrapgen::Value t_v{};",
        "[&]() {",
        "  k0(t_a.data_ptr(), s0);",
        "  t_x.reset();",
        "}();",
        "return;",
    ]


def test_guards_statics_and_returns_stay_in_the_function() -> None:
    lines = [
        "a();",
        "b();",
        "static auto* wg_graphs = new wrapgen::graphs::Program();",
        "wrapgen::graphs::RunGuard wg_graph_run(*wg_graphs, 0);",
        "std::vector<wrapgen::Tensor>& items = holder.items;",
        "int64_t a = 1, b = 2;",
        "c();",
        "d();",
        "if (e()) { return; }",
        "f();",
    ]
    out = split_into_pieces(lines, per_piece=2)
    assert out == [
        "[&]() {", "  a();", "  b();", "}();",
        "static auto* wg_graphs = new wrapgen::graphs::Program();",
        "wrapgen::graphs::RunGuard wg_graph_run(*wg_graphs, 0);",
        "std::vector<wrapgen::Tensor>& items = holder.items;",
        "int64_t a = 1, b = 2;",
        "[&]() {", "  c();", "  d();", "}();",
        "if (e()) { return; }",
        "f();",
    ]


def test_blocks_stay_whole_and_braces_in_strings_and_comments_do_not_count() -> None:
    lines = [
        "x();",
        "if (t_a.stride(0) != 1) {  // a brace in a comment: {",
        '  throw wrapgen::Error(1, "a brace in a string: {");',
        "} else {",
        "  y();",
        "}",
        "{",
        "  AtenTensorHandle ret0 = nullptr;",
        "  z(&ret0);",
        "}",
        "w();",
    ]
    out = split_into_pieces(lines, per_piece=2)
    assert out == ["[&]() {", *("  " + line for line in lines[:6]), "}();", "[&]() {", *("  " + line for line in lines[6:]), "}();"]


# -- models compiled with a cut at every other statement -------------------------------------------


@pytest.fixture
def tiny_pieces(monkeypatch):
    monkeypatch.setattr(body_split, "STATEMENTS_PER_PIECE", 2)


@pytest.mark.parametrize("name", list(cpp_cases.MODELS))
def test_models_run_as_eager_with_a_cut_every_two_statements(tiny_pieces, name) -> None:
    build, make, tolerances = cpp_cases.MODELS[name]
    mode = (True, "pooled")
    compiled = cpp_cases.compile_cpp(build(), tuple(make()), mode)
    assert compiled.source.count("[&]() {") > 3
    cpp_cases.check_case(build(), make, mode, **tolerances)


@pytest.mark.parametrize("case", list(e2e.DYNAMIC)[:2])
def test_dynamic_programs_run_as_eager_with_a_cut_every_two_statements(tiny_pieces, case) -> None:
    build, make = e2e.DYNAMIC[case]
    model = build()
    compiled = cpp_cases.compile_cpp(model, make(e2e.DYNAMIC_SIZES[0]), (True, "reuse"), dynamic=True)
    assert "[&]() {" in compiled.source
    e2e.check_dynamic(model, compiled, make)
    assert compiled.artifact.call.live_handles() == 0


def test_an_input_check_inside_a_piece_still_raises_naming_the_input(tiny_pieces) -> None:
    compiled = wrapgen.compile(lambda a, b: (a @ b).relu() + a.sum(), (torch.randn(4, 4), torch.randn(4, 4)), target="cpp")
    assert "[&]() {" in compiled.source
    with pytest.raises(Exception, match="expected shape"):
        compiled(torch.randn(5, 4), torch.randn(4, 4))
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    torch.testing.assert_close(compiled(a, b), (a @ b).relu() + a.sum())


def test_the_recording_branch_of_a_graph_region_is_split_too() -> None:
    body = [f"k{i}(t_a);" for i in range(5)]
    lines = [
        "{  // graph g0",
        "static auto* wg_region_g0 = new wrapgen::graphs::Region();",
        "wrapgen::graphs::Call wg_g0(*wg_graphs, *wg_region_g0, 0, true, true);",
        "if (wg_g0.replay()) {",
        "  t_out = wg_g0.output(0);",
        "} else {",
        "wrapgen::Tensor t_a = wg_g0.bind(0);",
        "wg_g0.begin_body();",
        *body,
        "wg_g0.end_body({&t_out}, {});",
        "}",
        "}  // graph g0",
    ]
    out = split_into_pieces(lines, per_piece=2)
    assert out[:6] == lines[:6]  # the statics, the guard-like call and the replay branch stay as they were
    assert out[-2:] == lines[-2:]
    recording = out[6:-2]
    assert recording[0] == "wrapgen::Tensor t_a{};"
    assert recording.count("[&]() {") == 4
    assert "  wg_g0.begin_body();" in recording and "  t_a = wg_g0.bind(0);" in recording
    assert all(f"  {line}" in recording for line in body)
