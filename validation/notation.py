"""Labels written with TeX math (``"$L^*_{\\rm LoRA}(1)$"``) shown where TeX is not rendered.

Claims may label their numbers the way their figures do, with ``$…$`` math; matplotlib renders it, a terminal and
a web page do not. :func:`plain` turns the math into Unicode text (``L*_LoRA(1)``), :func:`html` into HTML with
``<sub>``/``<sup>`` (nothing loaded from outside the page). Only the small part of TeX that labels use is read:
Greek letters and common symbols, ``\\rm``/``\\mathrm``/``\\text`` (dropped), ``\\mathcal``, sub- and
superscripts, braces, spacing commands; an unknown command shows as its name. Text outside ``$…$`` is kept as
written.
"""
from __future__ import annotations

from html import escape
import re

__all__ = ["plain", "html"]

SYMBOLS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε", "zeta": "ζ",
    "eta": "η", "theta": "θ", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν", "xi": "ξ", "pi": "π", "rho": "ρ",
    "sigma": "σ", "tau": "τ", "phi": "φ", "varphi": "φ", "chi": "χ", "psi": "ψ", "omega": "ω", "Gamma": "Γ",
    "Delta": "Δ", "Theta": "Θ", "Lambda": "Λ", "Xi": "Ξ", "Pi": "Π", "Sigma": "Σ", "Phi": "Φ", "Psi": "Ψ",
    "Omega": "Ω", "infty": "∞", "propto": "∝", "cdot": "·", "times": "×", "le": "≤", "leq": "≤", "ge": "≥",
    "geq": "≥", "approx": "≈", "sim": "~", "to": "→", "ell": "ℓ", "sqrt": "√", "|": "‖", "pm": "±",
    "neq": "≠", "ne": "≠", "in": "∈", "partial": "∂", "nabla": "∇", "log": "log", "max": "max", "min": "min",
    "exp": "exp", "top": "ᵀ", ",": " ", ";": " ", ":": " ", "!": "", " ": " ", "quad": " ", "{": "{", "}": "}",
    "_": "_", "%": "%", "$": "$",
}
CALLIGRAPHIC = dict(zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "𝒜ℬ𝒞𝒟ℰℱ𝒢ℋℐ𝒥𝒦ℒℳ𝒩𝒪𝒫𝒬ℛ𝒮𝒯𝒰𝒱𝒲𝒳𝒴𝒵"))
DROPPED = {"rm", "mathrm", "text", "textrm", "operatorname", "mathit", "mathbf", "bf", "it", "displaystyle",
           "left", "right", "big", "Big"}
SUBSCRIPT = dict(zip("0123456789+-=()aehijklmnoprstuvxβγρφχ", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓᵦᵧᵨᵩᵪ"))
SUPERSCRIPT = dict(zip("0123456789+-=()nit*T", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱᵗ*ᵀ"))
RELATIONS = set("=<>≤≥≈∝→~≠∈")  # TeX sets these apart with space; so does the text
_MATH = re.compile(r"(?<!\\)\$(.+?)(?<!\\)\$")
_TOKEN = re.compile(r"\\([A-Za-z]+|.)|([{}_^])|(\s+)|(.)", re.S)


def _tokens(tex: str) -> list[tuple[str, str]]:
    out = []
    for command, brace, space, char in _TOKEN.findall(tex):
        if command:
            out.append(("command", command))
        elif brace:
            out.append((brace, brace))
        elif char:
            out.append(("char", char))
    return out  # TeX ignores spaces in math mode


def _parse(tokens: list, i: int, stop: str | None):
    """Nodes up to ``stop`` (``}`` or the end): strings, and ("_"|"^", nodes) scripts."""
    nodes = []
    while i < len(tokens):
        kind, value = tokens[i]
        if kind == stop:
            return nodes, i + 1
        if kind == "{":
            group, i = _parse(tokens, i + 1, "}")
            nodes.extend(group)
            continue
        if kind in ("_", "^"):
            argument, i = _argument(tokens, i + 1)
            nodes.append((kind, argument))
            continue
        if kind == "command" and value == "mathcal":
            argument, i = _argument(tokens, i + 1)
            nodes.extend(CALLIGRAPHIC.get(n, n) if isinstance(n, str) else n for n in argument)
            continue
        if kind == "command" and value in DROPPED:
            i += 1
            continue
        symbol = SYMBOLS.get(value, value) if kind == "command" else value
        nodes.append(f" {symbol} " if symbol in RELATIONS else symbol)
        i += 1
    return nodes, i


def _argument(tokens: list, i: int):
    """The argument of a script or command: a braced group, one command or one character."""
    if i >= len(tokens):
        return [], i
    kind, value = tokens[i]
    if kind == "{":
        return _parse(tokens, i + 1, "}")
    if kind == "command":
        return [SYMBOLS.get(value, value)], i + 1
    return [value], i + 1


def _plain(nodes) -> str:
    text = ""
    for node in nodes:
        if isinstance(node, str):
            text += node
            continue
        kind, argument = node
        inner = _plain(argument)
        table = SUBSCRIPT if kind == "_" else SUPERSCRIPT
        if inner and all(c in table for c in inner):
            text += "".join(table[c] for c in inner)
        elif kind == "_":
            text += "_" + (inner if len(inner) == 1 or inner.isalnum() else f"({inner})")
        else:
            text += "^" + (inner if len(inner) == 1 or inner.isalnum() else f"({inner})")
    return text


def _html(nodes) -> str:
    out = ""
    for node in nodes:
        if isinstance(node, str):
            out += escape(node)
            continue
        kind, argument = node
        tag = "sub" if kind == "_" else "sup"
        out += f"<{tag}>{_html(argument)}</{tag}>"
    return out


def _math(tex: str):
    return _parse(_tokens(tex), 0, None)[0]


def _spaced(text: str) -> str:
    return re.sub(r" {2,}", " ", text)


def plain(label) -> str:
    """``label`` with its ``$…$`` math as Unicode text: ``"$L^*_{\\rm LoRA}(1)$"`` → ``"L*_LoRA(1)"``."""
    text = str(label)
    return _MATH.sub(lambda m: _spaced(_plain(_math(m[1]))).strip(), text).replace(r"\$", "$")


def html(label) -> str:
    """``label`` as escaped HTML, its ``$…$`` math with ``<sub>``/``<sup>``."""
    text, out, end = str(label), "", 0
    for match in _MATH.finditer(text):
        out += escape(text[end:match.start()].replace(r"\$", "$")) + _spaced(_html(_math(match[1]))).strip()
        end = match.end()
    return out + escape(text[end:].replace(r"\$", "$"))
