"""The C++ target's MultiKernelCall: `wrapgen::KernelChoice` (cpp_runtime's kernel_choice.h)
times the candidates once per key, on the run's own buffers (cloned and restored through the
shim), and caches the winner; the candidates are launched from C++ like any kernel (Triton
cubins through the driver). Each distinct grid is computed once. CPU C++ kernels are not
generated in several variants (multi-kernel is a Triton concern), but a choice between them
would work the same way, without a stream to wait for."""

from __future__ import annotations

import sympy
import torch

from wrapgen.backends.devices import device_overrides, kernel_device
from wrapgen.wrapper_ir.lines import KernelCall
from wrapgen.wrapper_ir.multi_kernel import MultiKernelCall


class CppMultiKernelMixin:
    """Mixed into CppEmitter (uses its body, writeline, kernels, launch prologues and expr)."""

    def emit_multi_kernel_call(self, line: MultiKernelCall) -> None:
        definitions = {k.name: k for k in self.kernels + self.gpu_kernels}  # type: ignore[attr-defined]
        missing = [c.kernel for c in line.candidates if c.kernel not in definitions]
        if missing:
            raise self.refuse(line, f"kernel {missing[0]} is not defined")  # type: ignore[attr-defined]
        devices = {torch.device(kernel_device(definitions[c.kernel])) for c in line.candidates}
        if len(devices) != 1:
            raise self.refuse(line, "candidates on different devices")  # type: ignore[attr-defined]
        (device,) = devices
        if str(device) not in self.launch_prologues:  # type: ignore[attr-defined]
            self.launch_prologues.add(str(device))  # type: ignore[attr-defined]
            for text in device_overrides(device).cpp_launch_prologue(device.index):
                self.writeline(text)  # type: ignore[attr-defined]
        self.headers.add("wrapgen/kernel_choice.h")  # type: ignore[attr-defined]
        self.use_shim("aoti_torch_clone", "aoti_torch_copy_")  # type: ignore[attr-defined]
        self.writeline("{")  # type: ignore[attr-defined]
        self.writeline(f'  static wrapgen::KernelChoice& wg_choice = wrapgen::kernel_choice("{line.choice}");')  # type: ignore[attr-defined]
        grid_symbols: dict[tuple, tuple[sympy.Symbol, ...]] = {}
        for index, grid in enumerate(line.grids()):
            symbols = tuple(sympy.Symbol(f"wg_grid{index}_{d}", integer=True) for d in range(len(grid)))
            grid_symbols[grid] = symbols
            for symbol, expr in zip(symbols, grid):
                self.writeline(f"  const int64_t {symbol} = {self.expr(line, expr)};")  # type: ignore[attr-defined]
        keys = [self.expr(line, k) for k in line.key]  # type: ignore[attr-defined]
        key = ", ".join(f"wrapgen::size_bucket({k})" if line.bucketed else k for k in keys)
        self.writeline(f"  const std::vector<int64_t> wg_key = {{{key}}};")  # type: ignore[attr-defined]
        self.writeline("  auto wg_launch = [&](int wg_index) {")  # type: ignore[attr-defined]
        self.writeline("    switch (wg_index) {")  # type: ignore[attr-defined]
        for index, call in enumerate(line.candidates):
            self.writeline(f"      case {index}: {{")  # type: ignore[attr-defined]
            for text in self._candidate_launch(KernelCall(call.kernel, call.args, grid_symbols[tuple(call.grid)], call.writes)):
                self.writeline(f"        {text}")  # type: ignore[attr-defined]
            self.writeline("        break;")  # type: ignore[attr-defined]
            self.writeline("      }")  # type: ignore[attr-defined]
        self.writeline('      default: throw wrapgen::Error(WG_RUNTIME_ERROR, "no such candidate");')  # type: ignore[attr-defined]
        self.writeline("    }")  # type: ignore[attr-defined]
        self.writeline("  };")  # type: ignore[attr-defined]
        sync = f"wrapgen::cuda_stream_sync(cuda_stream_{device.index or 0});" if device.type == "cuda" else ""
        writes = ", ".join(f"t_{w}.get()" for w in line.writes)
        self.writeline("  int wg_chosen = wg_choice.find(wg_key);")  # type: ignore[attr-defined]
        self.writeline("  if (wg_chosen < 0) {")  # type: ignore[attr-defined]
        serves = ", ".join("-1" if s is None else str(s) for s in line.serves)
        self.writeline(f"    wg_chosen = wg_choice.choose(wg_key, {len(line.candidates)}, wg_launch, [&] {{ {sync} }}, {{{writes}}}, "  # type: ignore[attr-defined]
                       f"{{{serves}}});")
        self.writeline("  }")  # type: ignore[attr-defined]
        self.writeline("  wg_launch(wg_chosen);")  # type: ignore[attr-defined]
        self.writeline("}")  # type: ignore[attr-defined]

    def _candidate_launch(self, call: KernelCall) -> list[str]:
        """The launch statements of one candidate, as emit_kernel_call writes them."""
        body = self.body  # type: ignore[attr-defined]
        start = len(body)
        self.emit_kernel_call(call)  # type: ignore[attr-defined]
        lines = [text.strip() for text in body[start:]]
        del body[start:]
        return lines
