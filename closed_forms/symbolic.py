"""sympy derivations that cross-check the numba kernels and print LaTeX (``attnflow solve SYSTEM --latex``).

SCB (docs/scb.md §8.2–8.3): starting from the reduced risk on the two lines,
    R(α_V, α_Q) = R* + (K_P/2)[(1 − α_V)²/T + K_Q(1 − α_Vα_Q)²],
the preconditioned gradient step α_V ← α_V − (η_V/K_P)∂R/∂α_V, α_Q ← α_Q − (η_Q/K_Q)∂R/∂α_Q is derived
symbolically; tests compare it with ``attnflow.closed_forms.scb.line_map_step`` and the normalised flow.
"""
from __future__ import annotations

import sympy as sp

__all__ = ["scb_line_system", "scb_latex"]


def scb_line_system() -> dict:
    """Symbols, the reduced risk, the 2-D map (eq. 7) and the normalised flow (eq. 8) of the SCB line."""
    a_V, a_Q = sp.symbols("alpha_V alpha_Q", real=True)
    K_P, K_Q, T, eta_V, eta_Q, eta, R_star = sp.symbols("K_P K_Q T eta_V eta_Q eta R^*", positive=True)
    risk = R_star + K_P / 2 * ((1 - a_V) ** 2 / T + K_Q * (1 - a_V * a_Q) ** 2)
    step_V = sp.simplify(a_V - eta_V / K_P * sp.diff(risk, a_V))
    step_Q = sp.simplify(a_Q - eta_Q / K_Q * sp.diff(risk, a_Q))
    eps = sp.Symbol("varepsilon", positive=True)
    # normalised flow: η_V = η/K_Q, η_Q = η/K_P, per unit τ = ηt, with T = 1/(εK_Q)
    normalise = {eta_V: eta / K_Q, eta_Q: eta / K_P}
    flow_V = sp.factor_terms(sp.expand(((step_V - a_V) / eta).subs(normalise).subs(T, 1 / (eps * K_Q))))
    flow_Q = sp.factor_terms(sp.expand(((step_Q - a_Q) / eta).subs(normalise)))
    return dict(symbols=dict(alpha_V=a_V, alpha_Q=a_Q, K_P=K_P, K_Q=K_Q, T=T, eta_V=eta_V, eta_Q=eta_Q, eta=eta,
                             epsilon=eps, R_star=R_star),
                risk=risk, map=(step_V, step_Q), flow=(flow_V, flow_Q))


def scb_latex() -> str:
    """LaTeX of the SCB line system: the reduced risk, the map (eq. 7) and the normalised flow (eq. 8)."""
    s = scb_line_system()
    plus_V, plus_Q = sp.Symbol(r"\alpha_V^{+}"), sp.Symbol(r"\alpha_Q^{+}")
    lines = [
        r"R(\alpha_V,\alpha_Q) = " + sp.latex(s["risk"]),
        sp.latex(sp.Eq(plus_V, s["map"][0])),
        sp.latex(sp.Eq(plus_Q, s["map"][1])),
        r"\frac{d\alpha_V}{d\tau} = " + sp.latex(s["flow"][0]),
        r"\frac{d\alpha_Q}{d\tau} = " + sp.latex(s["flow"][1]),
    ]
    return "\n".join(lines)
