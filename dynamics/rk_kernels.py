"""Writes the adaptive integrator's arithmetic out from the methods' tables.

The adaptive loop in ``dynamics/integrate.py`` is the same for every method; what tells methods apart is arithmetic
on their coefficients: the stage sums, the error norm, the interpolant's coefficients and its evaluation. This
module writes that arithmetic out as Python source, one expression per tableau row with the coefficients as
literals, for every method in :data:`~attnflow.dynamics.tableaus.METHODS`: ``dynamics/rk_kernels_generated.py``, which
the loop calls. Regenerate it after editing a table::

    python -m attnflow.dynamics.rk_kernels

(``tests/test_tableaus.py`` fails while the generated file is not what this module writes from the tables.)

Why written out, not loops over the tables read at run time: on the reduced flows' 2–420 components a sum over a
tableau row is a few dozen flops per component. As one pass over memory per term its set-up costs more than its
arithmetic on a short state; as one pass per component over a row whose length and coefficients are known only at
run time, the inner loop neither unrolls nor vectorises: DOPRI5 solves ran 1.3–1.5× and DOP853 ones up to 2.9×
slower than with rows written out. numba offers no way to unroll a table into code that compiles in reasonable time
(closures over each row, or ``literal_unroll``, cost seconds of compilation per method or ran no faster).

Every sum adds a row's terms in the row's order, its first term and then the nonzero ones, zero coefficients left
out (not multiplied), and a coefficient is printed with ``repr``, which gives the same float back: the arithmetic of
a term-by-term pass over the table, so both give the same bits (``tests/test_integrate.py`` checks it).
"""
from __future__ import annotations

import re
from pathlib import Path

from .tableaus import METHODS, EmbeddedPair

__all__ = ["source", "GENERATED"]

GENERATED = Path(__file__).with_name("rk_kernels_generated.py")
_WIDTH = 120


def _sum(row, count: int, index: str = "i") -> str:
    """``c₀ * K[0, i] + c_r * K[r, i] …`` over column 0 and the nonzero columns r < count, in order."""
    terms = []
    for r in range(count):
        c = row[r] if r < len(row) else 0.0
        if r > 0 and c == 0.0:
            continue
        if not terms:
            terms.append(f"{c!r} * K[{r}, {index}]")
        else:
            terms.append(f"{'-' if c < 0 else '+'} {abs(c)!r} * K[{r}, {index}]")
    return " ".join(terms)


def _wrap(text: str, indent: int) -> list[str]:
    """``text`` (a statement whose long part is inside parentheses) on lines of at most _WIDTH characters, broken
    before ``+``/``-`` terms and continued 8 spaces deeper."""
    lines = [" " * indent]
    for segment in re.split(r" (?=[+-] )", text):
        if lines[-1].strip() and len(lines[-1]) + 1 + len(segment) > _WIDTH:
            lines.append(" " * (indent + 8) + segment)
        else:
            lines[-1] += (" " if lines[-1].strip() else "") + segment
    return lines


def _stage_sum(pair: EmbeddedPair) -> list[str]:
    lines = []
    last = len(pair.c) - 1
    for s in range(1, last + 1):
        head = "if" if s == 1 else "elif"
        lines.append(f"        {head} s == {s}:" if s < last else "        else:")
        lines.append("            for i in range(y.size):")
        lines += _wrap(f"out[i] = y[i] + h * ({_sum(pair.a[s], s)})", 16)
    return lines


def _error_norm(pair: EmbeddedPair) -> list[str]:
    scale = "scale = atol + rtol * max(abs(y[i]), abs(y_new[i]))"
    if pair.error_3 is None:  # RMS of the embedded estimate h Σ e_s K[s]
        return ["        total = 0.0", "        for i in range(y.size):", f"            {scale}",
                *_wrap(f"total += (h * ({_sum(pair.error, pair.n_stages)}) / scale) ** 2", 12),
                "        return np.sqrt(total / y.size)"]
    # DOP853's |h| ‖e₅‖² / √(n (‖e₅‖² + 0.01 ‖e₃‖²))
    return ["        err5 = 0.0", "        err3 = 0.0", "        for i in range(y.size):", f"            {scale}",
            *_wrap(f"err5 += (({_sum(pair.error, pair.n_stages)}) / scale) ** 2", 12),
            *_wrap(f"err3 += (({_sum(pair.error_3, pair.n_stages)}) / scale) ** 2", 12),
            "        if err5 == 0.0 and err3 == 0.0:", "            return 0.0",
            "        return abs(h) * err5 / np.sqrt((err5 + 0.01 * err3) * y.size)"]


def _dense_coefficients(pair: EmbeddedPair) -> list[str]:
    last = pair.n_stages - 1
    if pair.hermite_as_scipy:
        third = f"dense[2, i] = 2.0 * delta - h * (K[{last}, i] + K[0, i])"
    else:
        third = f"dense[2, i] = delta - h * K[{last}, i] - slope_term"
    lines = ["        for i in range(y.size):", "            delta = y_new[i] - y[i]",
             "            slope_term = h * K[0, i] - delta", "            dense[0, i] = delta",
             "            dense[1, i] = slope_term", f"            {third}"]
    for r, row in enumerate(pair.dense):
        lines += _wrap(f"dense[{3 + r}, i] = h * ({_sum(row, len(pair.c))})", 12)
    return lines


def _interpolate(pair: EmbeddedPair) -> list[str]:
    rows = 3 + len(pair.dense)
    expression = f"dense[{rows - 1}, i]"
    for k in range(rows - 2, -1, -1):  # y + θ(F₀ + (1 − θ)(F₁ + θ(F₂ + …))), built from the innermost term
        factor = "theta1" if k % 2 == 0 else "theta"
        expression = f"dense[{k}, i] + {factor} * ({expression})" if k < rows - 2 else \
            f"dense[{k}, i] + {factor} * {expression}"
    return ["        for i in range(y.size):", *_wrap(f"ys[j, i] = y[i] + theta * ({expression})", 12)]


_HEADER = '''"""The adaptive integrator's arithmetic for each method, written out from its tables: GENERATED by
``python -m attnflow.dynamics.rk_kernels`` from ``dynamics/tableaus.py``; do not edit.

The methods, by their index in ``tableaus.METHODS``: {names}. ``K`` holds one stage derivative per row.
Each sum adds a tableau row's terms in order, the first and then the nonzero ones (``dynamics/rk_kernels.py``).
"""
import numpy as np
from numba.extending import overload

from .numba_compat import literal_choice
'''

_FUNCTIONS = (
    ("stage_sum", "s, y, h, K, out",
     "out = y + h Σ_{{r<s}} a_{{sr}} K[r]: the argument of stage ``s`` (for the step's last stage, the new\n"
     "    state).",
     _stage_sum),
    ("error_norm", "y, y_new, h, K, rtol, atol",
     "The step's error estimate in units of ``atol + rtol max(|y|, |y_new|)`` (< 1: the step is accepted).\n"
     "   ",
     _error_norm),
    ("dense_coefficients", "y, y_new, h, K, dense",
     "The interpolant's coefficient vectors F₀, F₁, … on the step [t, t + h], as the rows of ``dense``: three\n"
     "    Hermite terms from Δ = y_new − y, K[0] and the last stage, then h Σ_s d_s K[s] for each of the method's\n"
     "    rows d.",
     _dense_coefficients),
    ("interpolate", "y, dense, theta, ys, j",
     "The interpolant y + θ(F₀ + (1 − θ)(F₁ + θ(F₂ + (1 − θ)(F₃ + …)))) at θ ∈ (0, 1) into row ``j`` of\n"
     "    ``ys``.",
     _interpolate),
)


def _dedent(lines: list[str]) -> list[str]:
    """The bodies above are written for 8 spaces of indentation; a function body has 4."""
    return [line[4:] for line in lines]


def source(methods=METHODS) -> str:
    """The text of ``rk_kernels_generated.py`` for ``methods``: each kernel once per method, and a function choosing
    among them by the method's index. In compiled code that index is a constant of the caller, and the function is an
    ``@overload`` whose implementation is the chosen kernel itself (``numba_compat.literal_choice``): a loop
    specialised to one method compiles that method's kernels alone, with no function in between."""
    names = [pair.name.lower() for pair in methods]
    parts = [_HEADER.format(names=", ".join(f"{m} {pair.name}" for m, pair in enumerate(methods)))]
    for name, arguments, doc, body in _FUNCTIONS:
        for method_name, pair in zip(names, methods):
            lines = ["", "", f"def _{name}_{method_name}(method, {arguments}):",
                     f'    """:func:`{name}` for {pair.name}."""']
            if name == "interpolate":
                lines.append("    theta1 = 1.0 - theta")
            parts.append("\n".join(lines + _dedent(body(pair))) + "\n")
        table = f"_{name.upper()}"
        kernels = ", ".join(f"_{name}_{method_name}" for method_name in names) + ("," if len(names) == 1 else "")
        result = "return " if name == "error_norm" else ""
        # the interpolant runs once per output time: inlined into the loop, where a call would cost more than its sum
        decorator = f'@overload({name}, inline="always")' if name == "interpolate" else f"@overload({name})"
        parts.append("\n".join([
            "", "", f"{table} = ({kernels})", "", "",
            f"def {name}(method, {arguments}):",
            f'    """{doc.format()} ``method``: the index of the method, a constant in compiled code."""',
            f"    {result}{table}[method](method, {arguments})", "", "",
            decorator,
            f"def _{name}_jit(method, {arguments}):",
            f'    return literal_choice(method, {table}, "{name}")', ""]) + "\n")
    return "".join(parts).rstrip("\n") + "\n"


if __name__ == "__main__":
    GENERATED.write_text(source())
    print(f"wrote {GENERATED}")
