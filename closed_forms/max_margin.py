"""Hard-margin programs shared by the attention papers: least-distance programming with equalities, and its
nuclear-norm counterpart.

Both attention_svm (the token-selection SVMs of docs/attention_svm.md §3) and next_token_scc (the Graph-SVM of
docs/next_token_scc.md §4) solve

    min ||θ||  s.t.  <A_j, θ> = 0  (equality rows A),   <G_j, θ> ≥ h_j  (margin rows G)

in the Frobenius or the nuclear norm. The mathematics is written once here, on bare row matrices; each paper builds
its own rows.
"""
from __future__ import annotations

import numpy as np
from scipy import optimize

__all__ = ["ldp", "null_space_basis", "equality_ldp", "nuclear_program"]


def ldp(G, h) -> tuple[bool, np.ndarray, np.ndarray]:
    """Least-distance programming min ||x|| s.t. G x ≥ h by one NNLS (Lawson & Hanson 1974, ch. 23;
    docs/attention_svm.md §3.1).

    Solve min_{u ≥ 0} ||E u − e_{P+1}|| with E = [G^T; h^T]; r = E u − e_{P+1}. Infeasible iff r_{P+1} = 0
    (then u/h^T u is a Farkas certificate: u ≥ 0, G^T u ≈ 0, h^T u = 1). Otherwise x = −r_{1:P}/r_{P+1} and the
    KKT multipliers are λ = u/(−r_{P+1}) ≥ 0 with x = G^T λ. Returns (feasible, x or Farkas u, λ)."""
    G = np.asarray(G, float)
    h = np.asarray(h, float)
    m, P = G.shape
    E = np.vstack([G.T, h[None, :]])
    f = np.zeros(P + 1)
    f[-1] = 1.0
    u, _ = optimize.nnls(E, f, maxiter=50 * (m + P + 1))
    r = E @ u - f
    scale = max(1.0, float(np.abs(G).max(initial=0.0)))
    if -r[-1] < 1e-10:
        return False, u / max(h @ u, 1e-300), u
    x = -r[:P] / r[-1]
    lam = u / (-r[-1])
    if np.min(G @ x - h, initial=0.0) < -1e-8 * scale * max(1.0, np.linalg.norm(x)):
        return False, u, lam  # numerically infeasible: the NNLS residual is not a solution
    return True, x, lam


def null_space_basis(A, P: int) -> np.ndarray:
    """Orthonormal basis (columns, P × (P − rank A)) of {θ : A θ = 0}, from an SVD with a relative rank cut 1e-12."""
    A = np.asarray(A, float).reshape(-1, P)
    if len(A) == 0:
        return np.eye(P)
    _, sv, Vt = np.linalg.svd(A)
    r = int(np.sum(sv > 1e-12 * max(1.0, sv.max())))
    return Vt[r:].T


def equality_ldp(A, G, h=None) -> tuple[bool, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """min ||θ|| s.t. A θ = 0, G θ ≥ h (h = 1 by default): θ = N y on an orthonormal basis N of the null space of A,
    and y the least-distance program min ||y|| s.t. (G N) y ≥ h (one NNLS, :func:`ldp`).

    Returns (feasible, θ, λ, μ) with the KKT decomposition θ = G^T λ + A^T μ, λ ≥ 0 (μ by least squares), or
    (False, None, None, None)."""
    G = np.asarray(G, float)
    P = G.shape[1]
    A = np.asarray(A, float).reshape(-1, P)
    h = np.ones(len(G)) if h is None else np.asarray(h, float)
    N = null_space_basis(A, P)
    feasible, y, lam = (ldp(G @ N, h) if N.shape[1] else (False, None, None))
    if not feasible:
        return False, None, None, None
    theta = N @ y
    mu = np.linalg.lstsq(A.T, theta - G.T @ lam, rcond=None)[0] if len(A) else np.zeros(0)
    return True, theta, lam, mu


def nuclear_program(G, shape: tuple[int, int], start, start_lam, *, A=None, start_mu=None, gap: float = 1e-8,
                    max_iterations: int = 20_000) -> dict | None:
    """min ||W||_* s.t. <G_j, W> ≥ 1 and <A_j, W> = 0 (docs/attention_svm.md §3.2) by primal–dual hybrid gradient
    (Chambolle & Pock 2011) with singular-value thresholding, stopped at a certified relative duality gap ``gap``.

    G (m, P), A (k, P) rows of vec(W), W of ``shape`` (P = d₁d₂). ``start``, ``start_lam`` (and ``start_mu``): the
    Frobenius solution and its multipliers, the warm start. Dual: max 1^T λ s.t. ||G^T λ + A^T μ||_op ≤ 1, λ ≥ 0
    (μ free); lower bound 1^T λ/||G^T λ + A^T μ||_op. Upper bound ||W||_*/min_j <G_j, W> with W first projected onto
    {A W = 0} (exactly feasible). Returns dict(theta, lam, mu, margins, gap, iterations), or None when no iterate
    was feasible."""
    G = np.asarray(G, float)
    m = len(G)
    has_eq = A is not None and len(A) > 0
    rows = np.vstack([G, np.asarray(A, float)]) if has_eq else G
    if has_eq:
        N = null_space_basis(A, G.shape[1])
    start = np.asarray(start, float)
    step = 0.95 / np.linalg.norm(rows, 2)
    W = start.ravel().copy()
    Wbar = W.copy()
    # Warm start at the Frobenius solution and its multipliers rescaled to the nuclear dual's size
    # (1^T λ = ||W||_* at the optimum); it cuts the iterations on ill-conditioned instances severalfold.
    nuclear_start = np.linalg.svd(start.reshape(shape), compute_uv=False).sum()
    y = -np.asarray(start_lam, float) * nuclear_start / np.sum(start ** 2)
    if has_eq:
        mu0 = np.zeros(len(A)) if start_mu is None else np.asarray(start_mu, float)
        y = np.concatenate([y, -mu0 * nuclear_start / np.sum(start ** 2)])
    best = (np.inf, None, None)
    lower = 0.0
    it = 0
    for it in range(1, max_iterations + 1):
        if has_eq:
            r = rows @ Wbar
            y = np.concatenate([np.minimum(y[:m] + step * (r[:m] - 1.0), 0.0), y[m:] + step * r[m:]])
        else:
            y = np.minimum(y + step * (rows @ Wbar - 1.0), 0.0)
        U, s, Vt = np.linalg.svd((W - step * (rows.T @ y)).reshape(shape))
        s = np.maximum(s - step, 0.0)
        W_new = ((U * s) @ Vt).ravel()
        Wbar = 2 * W_new - W
        W = W_new
        if it % 25 == 0:
            if has_eq:
                feasible_W = N @ (N.T @ W)
                nuclear = np.linalg.svd(feasible_W.reshape(shape), compute_uv=False).sum()
            else:
                feasible_W, nuclear = W, s.sum()
            margin = float(np.min(G @ feasible_W))
            if margin > 0:
                upper = nuclear / margin
                if upper < best[0]:
                    best = (upper, feasible_W / margin, -y.copy())
            dual = -y
            op = np.linalg.norm((rows.T @ dual).reshape(shape), 2)
            if op > 0:
                lower = max(lower, dual[:m].sum() / op)
            if best[1] is not None and best[0] - lower <= gap * best[0]:
                break
    upper, W, dual = best
    if W is None:
        return None
    return dict(theta=W.reshape(shape), lam=dual[:m], mu=dual[m:], margins=G @ W, gap=float((upper - lower) / upper),
                iterations=it)
