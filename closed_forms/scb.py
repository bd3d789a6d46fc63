"""Sparse Contextual Bigrams learned by a one-layer linear transformer: the population mathematics.

Paper: Y. Ren, Z. Wang, J. D. Lee, *Learning and Transferring Sparse Contextual Bigrams with Linear Transformers*,
NeurIPS 2024 (arXiv:2410.23438). docs/scb.md reconstructs the paper (the available text lost its inline mathematics)
and derives every closed form used here; "docs/scb.md §k" cites its sections.

Data (docs/scb.md §2, eq. 1): x₁…x_T, x_{T+1} i.i.d. ~ μ, the stationary law of the column-stochastic P (Pμ = μ); given
x_{T+1} = k the label o is one Markov step Pe_{x_s} from a position s ~ q*⁽ᵏ⁾. Model (eq. 2): f = VXq⁽ᵏ⁾, loss
½‖e_o − f‖². Notation: D = diag(μ), ‖A‖²_μ = tr(AᵀAD), K_P = ‖P‖²_μ − ‖μ‖², κ = ‖Q*‖²_μ, K_Q = κ − 1/T.

The attention *matrix* is ``Q`` (T × N); the integer sparsity is ``sparsity`` (the paper writes Q for both).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

from attnflow import seeding

from . import checks as check
from .parameters import Parameter, parse_parameters

__all__ = ["MAX_MAP_STEPS", "related_transition", "SCBProblem", "mu_inner", "mu_norm2", "attention_statistics", "value_statistics", "population_risk",
           "raw_gradients", "preconditioned_gradients", "reduced_coordinates", "line_point", "line_map_step",
           "closure_map_step", "reduced_risk", "normalised_flow_rhs", "normalised_flow_rhs_into", "pack_line_params",
           "least_squares_V", "stage1_duration", "slow_mode_rate", "population_map_step", "population_map", "relative_distance",
           "off_support_spread", "transfer_start", "transfer_overlap", "transfer_step_size", "soft_threshold", "proximal_family_step",
           "STOCHASTIC_TOLERANCE", "label_integrated_noise_sums", "NOISE_MOMENT_NAMES",
           "related_transition"]

# K_P and K_Q at or below this are no signal at all (they are sums of squares of O(1) entries).
DEGENERATE_SIGNAL = 1e-12
# Column sums and stationarity are checked to this absolute tolerance.
STOCHASTIC_TOLERANCE = 1e-9


def _stationary_law(P: np.ndarray) -> np.ndarray:
    """The unique μ ∈ Δ^N with Pμ = μ, or ValueError if the eigenvalue 1 is not simple."""
    N = P.shape[0]
    singular = np.linalg.svd(P - np.eye(N), compute_uv=False)
    if N > 1 and singular[-2] < 1e-10:
        raise ValueError("P must have a unique stationary law (the eigenvalue 1 of P is not simple)")
    _, _, vt = np.linalg.svd(P - np.eye(N))
    mu = vt[-1]
    mu = mu / mu.sum()
    if np.any(mu < -STOCHASTIC_TOLERANCE):
        raise ValueError("P must have a non-negative stationary law")
    return np.clip(mu, 0.0, None) / np.clip(mu, 0.0, None).sum()


@dataclass(frozen=True)
class SCBProblem:
    """A Sparse Contextual Bigram task (docs/scb.md §2): column-stochastic P (N × N) with unique stationary law μ, and a
    ``sparsity``-sparse attention pattern Q* (T × N, columns in the simplex)."""

    P: np.ndarray
    Q_star: np.ndarray
    sparsity: int

    def __post_init__(self):
        P = check.finite_array(self.P, "P", ndim=2)
        if P.shape[0] != P.shape[1]:
            raise ValueError(f"P must be square, got shape {P.shape}")
        if np.any(P < 0) or np.abs(P.sum(axis=0) - 1).max() > STOCHASTIC_TOLERANCE:
            raise ValueError("P must be column-stochastic: non-negative entries, every column summing to 1")
        N = P.shape[0]
        Q_star = check.finite_array(self.Q_star, "Q_star", ndim=2)
        if Q_star.shape[1] != N:
            raise ValueError(f"Q_star must have N = {N} columns, got shape {Q_star.shape}")
        sparsity = check.integer(self.sparsity, "sparsity", minimum=1)
        T = Q_star.shape[0]
        if T < sparsity:
            raise ValueError(f"T (the rows of Q_star) must be >= sparsity = {sparsity}, got T = {T}")
        if np.any(Q_star < 0) or np.abs(Q_star.sum(axis=0) - 1).max() > STOCHASTIC_TOLERANCE:
            raise ValueError("Q_star columns must lie in the simplex: non-negative, summing to 1")
        densest = int((Q_star > 0).sum(axis=0).max())
        if densest > sparsity:
            raise ValueError(f"Q_star columns must have at most sparsity = {sparsity} nonzeros, found {densest}")
        object.__setattr__(self, "P", P)
        object.__setattr__(self, "Q_star", Q_star)
        object.__setattr__(self, "sparsity", sparsity)
        mu = _stationary_law(P)
        mu.setflags(write=False)
        object.__setattr__(self, "mu", mu)
        # The preconditioned steps divide by K_P and K_Q (η_V = η/K_Q, η_Q = η/K_P), and ε = 1/(T·K_Q).
        if self.K_P <= DEGENERATE_SIGNAL:
            raise ValueError("P must differ from mu 1ᵀ: K_P = ‖P − mu 1ᵀ‖²_mu = 0, so the next token would not "
                             "depend on the current one and the preconditioned step η/K_P is undefined")
        if self.K_Q <= DEGENERATE_SIGNAL:
            raise ValueError("Q_star must differ from uniform attention: K_Q = ‖Q* − 11ᵀ/T‖²_mu = 0 (for example "
                             "T = 1, or T = sparsity with uniform columns), so η/K_Q and ε = 1/(T K_Q) are undefined")

    @classmethod
    def random(cls, N: int, T: int, sparsity: int, *, seed, C: float = 2.0) -> "SCBProblem":
        """The paper's random instance (docs/scb.md §11): P with Dirichlet(1) columns, Q* with exactly ``sparsity``
        nonzeros per column at random positions, each at least 1/(C·sparsity) (Assumption 2.1(b))."""
        N = check.integer(N, "N", minimum=2)
        T = check.integer(T, "T", minimum=1)
        sparsity = check.integer(sparsity, "sparsity", minimum=1)
        if T < sparsity:
            raise ValueError(f"T must be >= sparsity = {sparsity}, got {T}")
        C = check.real(C, "C", minimum=1.0)
        rng = np.random.default_rng(seed)
        P = rng.dirichlet(np.ones(N), size=N).T
        Q_star = np.zeros((T, N))
        floor = 1.0 / (C * sparsity)
        for k in range(N):
            support = rng.choice(T, size=sparsity, replace=False)
            Q_star[support, k] = floor + (1 - sparsity * floor) * rng.dirichlet(np.ones(sparsity))
        return cls(P, Q_star, sparsity)

    PARAMETERS = (
        Parameter("N", "integer", 5, "vocabulary size", minimum=2, maximum=2000),
        Parameter("T", "integer", 8, "context length", minimum=1, maximum=100_000),
        Parameter("sparsity", "integer", 2, "nonzeros per column of Q* (the Q of the paper)", minimum=1),
        Parameter("C", "real", 2.0, "support entries of Q* are at least 1/(C·sparsity)", minimum=1.0),
        Parameter("instance_seed", "integer", 0, "seed of the random instance (P, Q*)", minimum=0),
    )

    @classmethod
    def from_params(cls, values) -> "SCBProblem":
        """The paper's random instance (:meth:`random`) from named text or values (``PARAMETERS``)."""
        p = parse_parameters(cls.PARAMETERS, values, owner="scb")
        return cls.random(p["N"], p["T"], p["sparsity"], seed=p["instance_seed"], C=p["C"])

    @property
    def N(self) -> int:
        return self.P.shape[0]

    @property
    def T(self) -> int:
        return self.Q_star.shape[0]

    @cached_property
    def K_P(self) -> float:
        """K_P = ‖P‖²_μ − ‖μ‖² = ‖P − μ1ᵀ‖²_μ (docs/scb.md §1)."""
        return mu_norm2(self, self.P) - float(self.mu @ self.mu)

    @cached_property
    def kappa(self) -> float:
        """κ = ‖Q*‖²_μ."""
        return mu_norm2(self, self.Q_star)

    @cached_property
    def K_Q(self) -> float:
        """K_Q = κ − 1/T = ‖Q* − (1/T)11ᵀ‖²_μ (docs/scb.md §1)."""
        return self.kappa - 1.0 / self.T

    @cached_property
    def epsilon(self) -> float:
        """ε = 1/(T·K_Q), the Stage-1 drift of the normalised map (docs/scb.md §8.3)."""
        return 1.0 / (self.T * self.K_Q)

    @cached_property
    def bayes_risk(self) -> float:
        """R* = ½(1 − ‖μ‖² − κK_P) = R(P, Q*) (docs/scb.md §4)."""
        return 0.5 * (1.0 - float(self.mu @ self.mu) - self.kappa * self.K_P)

    @cached_property
    def initial_risk(self) -> float:
        """R₀ = ½(1 − ‖μ‖²), the risk of predicting μ (V₀ = μ1ᵀ); R₀ − R* = ½κK_P."""
        return 0.5 * (1.0 - float(self.mu @ self.mu))

    def initial_point(self) -> tuple[np.ndarray, np.ndarray]:
        """(V₀, Q₀) = (μ1ᵀ, (1/T)11ᵀ) (docs/scb.md §3)."""
        return np.outer(self.mu, np.ones(self.N)), np.full((self.T, self.N), 1.0 / self.T)


MAX_MAP_STEPS = 10_000_000  # the longest run of population_map (a typo beyond it, not an experiment)

def mu_inner(problem: SCBProblem, A, B) -> float:
    """<A, B>_μ = tr(AᵀBD) = Σ_k μ_k <Ae_k, Be_k>."""
    A = check.finite_array(A, "A", ndim=2)
    if A.shape[1] != problem.N:
        raise ValueError(f"A must have N = {problem.N} columns, got shape {A.shape}")
    B = check.finite_array(B, "B", shape=A.shape)
    return float(np.einsum("ik,ik,k->", A, B, problem.mu))


def mu_norm2(problem: SCBProblem, A) -> float:
    return mu_inner(problem, A, A)


def _check_V(problem, V):
    return check.finite_array(V, "V", shape=(problem.N, problem.N))


def _check_Q(problem, Q):
    return check.finite_array(Q, "Q", shape=(problem.T, problem.N))


def attention_statistics(problem: SCBProblem, Q) -> dict:
    """a = ‖Q‖²_μ, b = <Q*, Q>_μ, ū = Σμ_k u_k, ū₂ = Σμ_k u_k², u_k = 1ᵀq⁽ᵏ⁾ (docs/scb.md §4)."""
    Q = _check_Q(problem, Q)
    u = Q.sum(axis=0)
    return dict(a=mu_norm2(problem, Q), b=mu_inner(problem, problem.Q_star, Q), u_bar=float(problem.mu @ u),
                u2_bar=float(problem.mu @ u**2), u=u)


def value_statistics(problem: SCBProblem, V) -> dict:
    """n_V = ‖V‖²_μ, m_V = ‖Vμ‖², p_V = <V, P>_μ, r_V = <Vμ, μ>, A_V = n_V − m_V, B_V = p_V − r_V (docs/scb.md §4)."""
    V = _check_V(problem, V)
    mu = problem.mu
    n_V, m_V = mu_norm2(problem, V), float((V @ mu) @ (V @ mu))
    p_V, r_V = mu_inner(problem, V, problem.P), float((V @ mu) @ mu)
    return dict(n_V=n_V, m_V=m_V, p_V=p_V, r_V=r_V, A_V=n_V - m_V, B_V=p_V - r_V)


def population_risk(problem: SCBProblem, V, Q) -> float:
    """R(V, Q) = ½ − [b p_V + (ū − b) r_V] + ½[a n_V + (ū₂ − a) m_V], for all V, Q (docs/scb.md §4)."""
    s, v = attention_statistics(problem, Q), value_statistics(problem, V)
    return (0.5 - (s["b"] * v["p_V"] + (s["u_bar"] - s["b"]) * v["r_V"])
            + 0.5 * (s["a"] * v["n_V"] + (s["u2_bar"] - s["a"]) * v["m_V"]))


def raw_gradients(problem: SCBProblem, V, Q) -> tuple[np.ndarray, np.ndarray]:
    """E∇_V ℓ and E∇_Q ℓ (Lemma B.7, docs/scb.md §7), valid for all V, Q:
        E∇_V = V(aD + (ū₂ − a)μμᵀ) − P(bD + (ū − b)μμᵀ),
        E∇_Q = [A_V Q − B_V Q* + 1_T(m_V u − r_V 1_N)ᵀ] D."""
    V, Q = _check_V(problem, V), _check_Q(problem, Q)
    s, v = attention_statistics(problem, Q), value_statistics(problem, V)
    mu, D = problem.mu, np.diag(problem.mu)
    grad_V = V @ (s["a"] * D + (s["u2_bar"] - s["a"]) * np.outer(mu, mu)) - problem.P @ (
        s["b"] * D + (s["u_bar"] - s["b"]) * np.outer(mu, mu))
    grad_Q = (v["A_V"] * Q - v["B_V"] * problem.Q_star
              + np.outer(np.ones(problem.T), v["m_V"] * s["u"] - v["r_V"])) * mu[None, :]
    return grad_V, grad_Q


def preconditioned_gradients(problem: SCBProblem, V, Q) -> tuple[np.ndarray, np.ndarray]:
    """G_V = E∇_V(D⁻¹ − 11ᵀ) = aV(I − μ1ᵀ) − b(P − μ1ᵀ) and G_Q = (I − 11ᵀ/T)E∇_Q D⁻¹
    = A_V(Q − (1/T)1uᵀ) − B_V(Q* − (1/T)11ᵀ) (Lemma B.8, docs/scb.md §7; eq. 4), valid for all V, Q."""
    V, Q = _check_V(problem, V), _check_Q(problem, Q)
    s, v = attention_statistics(problem, Q), value_statistics(problem, V)
    N, T, mu = problem.N, problem.T, problem.mu
    G_V = s["a"] * V @ (np.eye(N) - np.outer(mu, np.ones(N))) - s["b"] * (problem.P - np.outer(mu, np.ones(N)))
    G_Q = v["A_V"] * (Q - np.outer(np.ones(T), s["u"]) / T) - v["B_V"] * (problem.Q_star - 1.0 / T)
    return G_V, G_Q


# ==================================================================================================
# Reduced coordinates and maps (docs/scb.md §8)
# ==================================================================================================


def reduced_coordinates(problem: SCBProblem, V, Q) -> dict:
    """α_V, α_Q (μ-least-squares projections on the two lines), the residuals ΔV, ΔQ and e_V = ‖ΔV‖²_μ,
    e_Q = ‖ΔQ‖²_μ (Lemma C.1, docs/scb.md §8.1)."""
    V, Q = _check_V(problem, V), _check_Q(problem, Q)
    V_dir = problem.P - np.outer(problem.mu, np.ones(problem.N))
    Q_dir = problem.Q_star - 1.0 / problem.T
    V_off = V - np.outer(problem.mu, np.ones(problem.N))
    Q_off = Q - 1.0 / problem.T
    alpha_V = mu_inner(problem, V_off, V_dir) / problem.K_P
    alpha_Q = mu_inner(problem, Q_off, Q_dir) / problem.K_Q
    dV, dQ = V_off - alpha_V * V_dir, Q_off - alpha_Q * Q_dir
    return dict(alpha_V=alpha_V, alpha_Q=alpha_Q, e_V=mu_norm2(problem, dV), e_Q=mu_norm2(problem, dQ),
                delta_V=dV, delta_Q=dQ)


def line_point(problem: SCBProblem, alpha_V: float, alpha_Q: float) -> tuple[np.ndarray, np.ndarray]:
    """(V, Q) = (μ1ᵀ + α_V(P − μ1ᵀ), (1/T)11ᵀ + α_Q(Q* − (1/T)11ᵀ)): the invariant line of docs/scb.md §8.3."""
    alpha_V, alpha_Q = check.real(alpha_V, "alpha_V"), check.real(alpha_Q, "alpha_Q")
    V0, Q0 = problem.initial_point()
    return V0 + alpha_V * (problem.P - V0), Q0 + alpha_Q * (problem.Q_star - Q0)


@njit(cache=True)
def line_map_step(k, x, params):
    """The 2-D population map on the line (eq. 7, docs/scb.md §8.3); params = (η_V, η_Q, K_P, K_Q, T):
        α_V⁺ = α_V + η_V[(1 − α_V)/T + K_Q α_Q(1 − α_Vα_Q)],   α_Q⁺ = α_Q + η_Q K_P α_V(1 − α_Vα_Q)."""
    eta_V, eta_Q, K_P, K_Q, T = params[0], params[1], params[2], params[3], params[4]
    a_V, a_Q = x[0], x[1]
    gap = 1.0 - a_V * a_Q
    out = np.empty(2)
    out[0] = a_V + eta_V * ((1.0 - a_V) / T + K_Q * a_Q * gap)
    out[1] = a_Q + eta_Q * K_P * a_V * gap
    return out


@njit(cache=True)
def closure_map_step(k, x, params):
    """The exact 4-scalar population map off the line, λ = 0 (Lemmas C.5–C.6, docs/scb.md §8.2); x = (α_V, α_Q, e_V, e_Q):
        a = 1/T + α_Q²K_Q + e_Q, b = 1/T + α_QK_Q, A_V = α_V²K_P + e_V, B_V = α_VK_P,
        α_V⁺ = α_V − η_V(aα_V − b), α_Q⁺ = α_Q − η_Q(A_Vα_Q − B_V), e_V⁺ = (1 − η_Va)²e_V, e_Q⁺ = (1 − η_QA_V)²e_Q."""
    eta_V, eta_Q, K_P, K_Q, T = params[0], params[1], params[2], params[3], params[4]
    a_V, a_Q, e_V, e_Q = x[0], x[1], x[2], x[3]
    a = 1.0 / T + a_Q * a_Q * K_Q + e_Q
    b = 1.0 / T + a_Q * K_Q
    A_V = a_V * a_V * K_P + e_V
    B_V = a_V * K_P
    out = np.empty(4)
    out[0] = a_V - eta_V * (a * a_V - b)
    out[1] = a_Q - eta_Q * (A_V * a_Q - B_V)
    out[2] = (1.0 - eta_V * a) ** 2 * e_V
    out[3] = (1.0 - eta_Q * A_V) ** 2 * e_Q
    return out


@njit(cache=True)
def normalised_flow_rhs_into(t, x, params, out):
    """Gradient-flow limit in τ = ηt with η_V = η/K_Q, η_Q = η/K_P (docs/scb.md §8.3); params[0] = ε = 1/(TK_Q):
        dα_V/dτ = α_Q(1 − α_Vα_Q) + ε(1 − α_V),   dα_Q/dτ = α_V(1 − α_Vα_Q),
    written into ``out`` (the integrator's calling convention)."""
    eps = params[0]
    gap = 1.0 - x[0] * x[1]
    out[0] = x[1] * gap + eps * (1.0 - x[0])
    out[1] = x[0] * gap


@njit(cache=True)
def normalised_flow_rhs(t, x, params):
    """The normalised flow's right-hand side as a new vector: :func:`normalised_flow_rhs_into`."""
    out = np.empty(2)
    normalised_flow_rhs_into(t, x, params, out)
    return out


def pack_line_params(problem: SCBProblem, eta_V: float, eta_Q: float) -> np.ndarray:
    eta_V = check.real(eta_V, "eta_V", minimum=0.0, strict=True)
    eta_Q = check.real(eta_Q, "eta_Q", minimum=0.0, strict=True)
    return np.array([eta_V, eta_Q, problem.K_P, problem.K_Q, problem.T], dtype=float)


def reduced_risk(problem: SCBProblem, alpha_V: float, alpha_Q: float, e_V: float = 0.0, e_Q: float = 0.0) -> float:
    """R = R* + (K_P/2)[(1 − α_V)²/T + K_Q(1 − α_Vα_Q)²] + ½(a e_V + α_V²K_P e_Q) on 𝒱 × 𝒬 (docs/scb.md §8.2)."""
    K_P, K_Q, T = problem.K_P, problem.K_Q, problem.T
    alpha_V, alpha_Q = check.finite_array(alpha_V, "alpha_V"), check.finite_array(alpha_Q, "alpha_Q")
    e_V, e_Q = check.real(e_V, "e_V", minimum=0.0), check.real(e_Q, "e_Q", minimum=0.0)  # squared μ-norms
    if max(np.abs(alpha_V).max(initial=0.0), np.abs(alpha_Q).max(initial=0.0)) > 1e75:  # quartic in the α's
        raise ValueError("alpha_V and alpha_Q must be at most 1e75 in size to keep the risk finite")
    a = 1.0 / T + alpha_Q**2 * K_Q + e_Q
    return (problem.bayes_risk + 0.5 * K_P * ((1 - alpha_V) ** 2 / T + K_Q * (1 - alpha_V * alpha_Q) ** 2)
            + 0.5 * (a * e_V + alpha_V**2 * K_P * e_Q))


def least_squares_V(problem: SCBProblem, Q) -> np.ndarray:
    """V_LS(Q) = μ1ᵀ + (b/a)(P − μ1ᵀ): the population-optimal V for a fixed Q with 1ᵀQ = 1ᵀ (docs/scb.md §8.6)."""
    Q = _check_Q(problem, Q)
    if np.abs(Q.sum(axis=0) - 1).max() > 1e-8:
        raise ValueError("Q must have columns summing to 1 for the least-squares V of docs/scb.md §8.6")
    s = attention_statistics(problem, Q)
    V0 = np.outer(problem.mu, np.ones(problem.N))
    return V0 + s["b"] / s["a"] * (problem.P - V0)


def related_transition(problem: SCBProblem, rho: float, *, seed, noise: float = 0.1) -> np.ndarray:
    """A pretrained value layer from a related task (docs/scb.md §6, transfer): P̃ = μ1ᵀ + ρ(P − μ1ᵀ) + Δ, with Δ a
    Gaussian (scale ``noise``) projected so that 1ᵀP̃ = 1ᵀ and P̃μ = μ. Its overlap <P̃ − μ1ᵀ, P − μ1ᵀ>_μ is
    ρK_P plus a term of size ``noise``."""
    rho = check.real(rho, "rho", minimum=0.0, strict=True, maximum=1.0)
    noise = check.real(noise, "noise", minimum=0.0)
    N, mu = problem.N, problem.mu
    ones = np.ones((N, N))
    gaussian = np.random.default_rng(seeding.as_seed_sequence(seed)).normal(scale=noise, size=(N, N))
    tangent = (np.eye(N) - ones / N) @ gaussian @ (np.eye(N) - np.outer(mu, np.ones(N)))
    base = np.outer(mu, np.ones(N))
    return base + rho * (problem.P - base) + tangent


def stage1_duration(problem: SCBProblem, eta: float, c: float = 0.1) -> dict:
    """Predicted Stage-1 duration (docs/scb.md §8.4): τ₁ = log(2c/ε) − ½·log(1 − c²) in normalised time, the
    crossing of α_V ≈ α_Q = a under da/dτ = a(1 − a²) started on s_α = ε(e^τ − 1), exact as ε → 0; and
    t₁ ≈ log(1 + 2cTK_Q)/log(1 + η) steps of the normalised map (its linear phase)."""
    eta = check.real(eta, "eta", minimum=0.0, strict=True)
    c = check.real(c, "c", minimum=0.0, strict=True, maximum=1.0)
    if c >= 1.0:
        raise ValueError(f"c must be < 1 (the flow's fixed point is α_V = α_Q = 1), got {c}")
    tau = math.log(2 * c / problem.epsilon) - 0.5 * math.log1p(-c * c)
    return dict(tau=tau, steps=math.log1p(2 * c * problem.T * problem.K_Q) / math.log1p(eta))


def slow_mode_rate(problem: SCBProblem) -> float:
    """The slow eigenvalue at (1, 1) of the normalised flow, (−(2 + ε) + √(4 + ε²))/2 ≈ −ε/2 (docs/scb.md §8.4)."""
    eps = problem.epsilon
    return (-(2 + eps) + math.sqrt(4 + eps * eps)) / 2


# ==================================================================================================
# The full-matrix population (proximal) map and the proximal 4-scalar family (docs/scb.md §5, §7, §8.5)
# ==================================================================================================


@njit(cache=True)
def soft_threshold(x, theta):
    """S_θ(x) = sign(x)·max(|x| − θ, 0), elementwise."""
    out = np.empty_like(x)
    for i in range(x.size):
        v = x.flat[i]
        out.flat[i] = v - theta if v > theta else (v + theta if v < -theta else 0.0)
    return out


@njit(cache=True)
def _mu_inner_kernel(A, B, mu):
    """<A, B>_μ = Σ_k μ_k Σ_i A[i, k]B[i, k] (the kernel twin of :func:`mu_inner`)."""
    total = 0.0
    for k in range(A.shape[1]):
        for i in range(A.shape[0]):
            total += mu[k] * A[i, k] * B[i, k]
    return total


@njit(cache=True)
def _population_map_kernel(V, Q, P, Q_star, mu, eta_V, eta_Q, lam):
    N, T = V.shape[0], Q.shape[0]
    a = _mu_inner_kernel(Q, Q, mu)
    b = _mu_inner_kernel(Q_star, Q, mu)
    # The products as np.dot into a buffer, with a writable copy of μ: the BLAS calls of V @ μ and of the two dot
    # products, typed as the other kernels' products are, so numba compiles them once (a read-only μ is another type)
    mu_copy = np.empty(N)
    for i in range(N):
        mu_copy[i] = mu[i]
    Vmu = np.empty(N)
    np.dot(V, mu_copy, Vmu)
    n_V = _mu_inner_kernel(V, V, mu)
    p_V = _mu_inner_kernel(V, P, mu)
    A_V = n_V - np.dot(Vmu, Vmu)
    B_V = p_V - np.dot(Vmu, mu_copy)
    V_new = np.empty_like(V)
    for i in range(N):
        for j in range(N):
            V_new[i, j] = V[i, j] - eta_V * (a * (V[i, j] - Vmu[i]) - b * (P[i, j] - mu[i]))
    # Column sums, the threshold and the projection in scalar loops (the order of numpy's sums; they compile faster).
    theta = eta_Q * lam
    Q_new = np.empty((T, N))
    for k in range(N):
        u = 0.0
        for t in range(T):
            u += Q[t, k]
        column = 0.0
        for t in range(T):
            v = Q[t, k] - eta_Q * (A_V * (Q[t, k] - u / T) - B_V * (Q_star[t, k] - 1.0 / T))
            v = v - theta if v > theta else (v + theta if v < -theta else 0.0)  # S_θ
            Q_new[t, k] = v
            column += v
        shift = (1.0 - column) / T
        for t in range(T):
            Q_new[t, k] += shift
    return V_new, Q_new


def population_map_step(problem: SCBProblem, V, Q, eta_V: float, eta_Q: float, lam: float = 0.0):
    """One step of the population (proximal) map in full matrix form (docs/scb.md §7):
    V⁺ = V − η_V G_V,  Q⁺ = Π_aff(S_{η_Qλ}(Q − η_Q G_Q))."""
    V, Q = _check_V(problem, V), _check_Q(problem, Q)
    eta_V = check.real(eta_V, "eta_V", minimum=0.0, strict=True)
    eta_Q = check.real(eta_Q, "eta_Q", minimum=0.0, strict=True)
    lam = check.real(lam, "lam", minimum=0.0)
    # writable C-ordered P and Q*, like V and Q: the <A, B>_μ kernel then compiles once, not for three layouts
    return _population_map_kernel(V.copy(), Q.copy(), np.array(problem.P, order="C"),
                                  np.array(problem.Q_star, order="C"), problem.mu, eta_V, eta_Q, lam)


def population_map(problem: SCBProblem, V, Q, eta_V: float, eta_Q: float, lam: float = 0.0, *, steps: int):
    """``steps`` iterations of :func:`population_map_step` from (V, Q); returns the final (V, Q). A step that leaves the
    finite region raises FloatingPointError naming the step."""
    steps = check.integer(steps, "steps", minimum=0)
    if steps > MAX_MAP_STEPS:
        raise ValueError(f"steps must be <= {MAX_MAP_STEPS:.0e}, got {steps}")
    V, Q = _check_V(problem, V), _check_Q(problem, Q)
    check.real(eta_V, "eta_V", minimum=0.0, strict=True), check.real(eta_Q, "eta_Q", minimum=0.0, strict=True)
    check.real(lam, "lam", minimum=0.0)
    for step in range(1, steps + 1):
        V, Q = population_map_step(problem, V, Q, eta_V, eta_Q, lam)
        if not (np.all(np.isfinite(V)) and np.all(np.isfinite(Q))):  # too large a step: the map diverges
            raise FloatingPointError(f"the population map diverged at step {step} (eta_V={eta_V:g}, eta_Q={eta_Q:g})")
    return V, Q


def relative_distance(problem: SCBProblem, state, reference) -> float:
    """√(‖V − V_ref‖²_μ/K_P + ‖Q − Q_ref‖²_μ/K_Q): the distance of two (V, Q) pairs in the units of docs/scb.md §13 #16."""
    (V, Q), (V_ref, Q_ref) = state, reference
    return math.sqrt(mu_norm2(problem, np.asarray(V) - V_ref) / problem.K_P
                     + mu_norm2(problem, np.asarray(Q) - Q_ref) / problem.K_Q)


def off_support_spread(problem: SCBProblem, Q) -> float:
    """Σ_k μ_k Σ_{t ∉ S_k} (q_t⁽ᵏ⁾ − mean_off)²: the μ-weighted spread of the attention entries off the true
    supports around their column mean (the proximal step makes them all equal, the affine projection's b₀)."""
    Q = _check_Q(problem, Q)
    off_support = problem.Q_star == 0
    total = 0.0
    for k in range(problem.N):
        values = Q[off_support[:, k], k]
        total += problem.mu[k] * float(np.sum((values - values.mean()) ** 2)) if values.size else 0.0
    return total


def transfer_start(problem: SCBProblem, P_tilde, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """(V₀, Q₀) = (μ1ᵀ + γ(P̃ − μ1ᵀ), (1/T)11ᵀ): the transfer initialisation of docs/scb.md §6 (needs P̃μ = μ)."""
    P_tilde = check.finite_array(P_tilde, "P_tilde", shape=(problem.N, problem.N))
    if np.abs(P_tilde @ problem.mu - problem.mu).max() > 1e-9:
        raise ValueError("P_tilde must have the task's stationary law: P_tilde @ mu == mu")
    gamma = check.real(gamma, "gamma", minimum=0.0, strict=True, maximum=1.0)
    base = np.outer(problem.mu, np.ones(problem.N))
    return base + gamma * (P_tilde - base), np.full((problem.T, problem.N), 1.0 / problem.T)


def transfer_overlap(problem: SCBProblem, P_tilde) -> float:
    """<P̃ − μ1ᵀ, P − μ1ᵀ>_μ: how much of the task's signal the related task's transition matrix carries."""
    P_tilde = check.finite_array(P_tilde, "P_tilde", shape=(problem.N, problem.N))
    base = np.outer(problem.mu, np.ones(problem.N))
    return mu_inner(problem, P_tilde - base, problem.P - base)


def transfer_step_size(problem: SCBProblem, P_tilde, gamma: float) -> float:
    """η₀ = 1/(γ<P̃ − μ1ᵀ, P − μ1ᵀ>_μ): the Q-step that lands the population exactly at α_Q = 1 (Theorem 4.1,
    docs/scb.md §13 #12)."""
    gamma = check.real(gamma, "gamma", minimum=0.0, strict=True, maximum=1.0)
    overlap = transfer_overlap(problem, P_tilde)
    if overlap <= 0:
        raise ValueError("P_tilde must be positively correlated with P (<P_tilde − μ1ᵀ, P − μ1ᵀ>_μ > 0)")
    return 1.0 / (gamma * overlap)


def proximal_family_step(problem: SCBProblem, state, eta_V: float, eta_Q: float, lam: float) -> np.ndarray:
    """One population proximal step on the closed family q⁽ᵏ⁾ = ξq*⁽ᵏ⁾ + b₀1 + b_S1_{S_k}, V on its line
    (docs/scb.md §8.5); state = (α_V, ξ, b₀, b_S). Needs every column of Q* to have exactly ``sparsity`` nonzeros and
    every support entry to stay above the threshold (checked)."""
    if np.any((problem.Q_star > 0).sum(axis=0) != problem.sparsity):
        raise ValueError("the proximal family needs exactly `sparsity` nonzeros in every column of Q_star")
    alpha_V, xi, b0, bS = check.finite_array(state, "state", shape=(4,))
    eta_V = check.real(eta_V, "eta_V", minimum=0.0, strict=True)
    eta_Q = check.real(eta_Q, "eta_Q", minimum=0.0, strict=True)
    lam = check.real(lam, "lam", minimum=0.0)
    T, Qs, kappa, K_P = problem.T, problem.sparsity, problem.kappa, problem.K_P
    a = xi**2 * kappa + T * b0**2 + Qs * bS**2 + 2 * xi * (b0 + bS) + 2 * Qs * b0 * bS
    b = xi * kappa + b0 + bS
    A_V, B_V = alpha_V**2 * K_P, alpha_V * K_P
    theta = eta_Q * lam
    alpha_V_new = alpha_V - eta_V * (a * alpha_V - b)
    xi_t = (1 - eta_Q * A_V) * xi + eta_Q * B_V
    b0_t = (1 - eta_Q * A_V) * b0 + eta_Q * (A_V - B_V) / T
    bS_t = (1 - eta_Q * A_V) * bS
    q_min = problem.Q_star[problem.Q_star > 0].min()
    if xi_t * q_min + b0_t + bS_t <= theta:
        raise ValueError("a support entry fell below the threshold: the proximal family is not closed here")
    b0_hat = math.copysign(max(abs(b0_t) - theta, 0.0), b0_t)
    bS_hat = b0_t + bS_t - theta - b0_hat
    b0_new = b0_hat + (1 - xi_t - T * b0_hat - Qs * bS_hat) / T
    return np.array([alpha_V_new, xi_t, b0_new, bS_hat])


# ==================================================================================================
# Gradient noise in the reduced coordinates (docs/scb.md §14)
# ==================================================================================================

# The per-sample quantities whose moments the diffusion tier needs, in the order of the kernel's output:
# ‖∇̃_Vℓ‖²_μ, ‖∇̃_Qℓ‖²_μ, n_V = ⟨∇̃_Vℓ, P − μ1ᵀ⟩_μ, n_Q = ⟨∇̃_Qℓ, Q* − 11ᵀ/T⟩_μ, n_V², n_Q², n_V·n_Q.
NOISE_MOMENT_NAMES = ("norm2_v", "norm2_q", "n_v", "n_q", "n_v2", "n_q2", "n_vq")


@njit(cache=True)
def _label_integrated_noise(tokens, last, V, Q, P, Q_star, mu):
    """Per context (x_1..x_T, k) the label-integrated conditional means E[· | x, k] of NOISE_MOMENT_NAMES
    (docs/scb.md §14), summed over contexts; returns (sums (7,), sums of squares (7,)) for standard errors.

    With y = Xq⁽ᵏ⁾, y* = Xq*⁽ᵏ⁾, u = 1ᵀy, v = Vy, p = Py* (the law of o) and r = e_o − v:
    ‖∇̃_Vℓ‖²_μ = ‖r‖²(Σ_j y_j²/μ_j − u²) and n_V = −rᵀz with z = Py − uμ; for the attention, column k of ∇̃_Qℓ is
    −μ_k⁻¹(c − c̄1) with c_t = w_{x_t}, w = Vᵀr, so ‖∇̃_Qℓ‖²_μ = μ_k⁻¹Σ_t(c_t − c̄)² and n_Q = −(Σ_t q*_t c_t − c̄).
    Every expectation over o ~ p is a finite sum; the cost is O(N·T) per context (y, y* live on at most T tokens)."""
    n, T = tokens.shape
    N = V.shape[0]
    sums = np.zeros(7)
    squares = np.zeros(7)
    y = np.zeros(N)
    ys = np.zeros(N)
    v = np.empty(N)
    p = np.empty(N)
    z = np.empty(N)
    b = np.empty(N)
    beta = np.empty(T)
    values = np.empty(7)
    seen = np.zeros(N, np.bool_)
    present = np.empty(T, np.int64)  # the distinct tokens of the context: y and y* live on them
    for c in range(n):
        k = last[c]
        n_present = 0
        for t in range(T):
            token = tokens[c, t]
            if not seen[token]:
                seen[token] = True
                present[n_present] = token
                n_present += 1
            y[token] += Q[t, k]
            ys[token] += Q_star[t, k]
        u = 0.0
        A = 0.0
        for m in range(n_present):
            j = present[m]
            u += y[j]
            A += y[j] * y[j] / mu[j]
        A -= u * u
        for i in range(N):
            acc_v = 0.0
            acc_p = 0.0
            acc_z = 0.0
            for m in range(n_present):
                j = present[m]
                acc_v += V[i, j] * y[j]
                acc_p += P[i, j] * ys[j]
                acc_z += P[i, j] * y[j]
            v[i] = acc_v
            p[i] = acc_p
            z[i] = acc_z - u * mu[i]
        pv = 0.0
        vv = 0.0
        vz = 0.0
        for i in range(N):
            pv += p[i] * v[i]
            vv += v[i] * v[i]
            vz += v[i] * z[i]
        for m in range(n_present):  # b = Vᵀv on the context's tokens: c_t = V[o, x_t] − b[x_t]
            j = present[m]
            acc = 0.0
            for i in range(N):
                acc += V[i, j] * v[i]
            b[j] = acc
        beta_mean = 0.0
        beta_star = 0.0
        for t in range(T):
            beta[t] = b[tokens[c, t]]
            beta_mean += beta[t] / T
            beta_star += Q_star[t, k] * beta[t]
        norm2_Q = 0.0
        n_V = 0.0
        n_Q = 0.0
        n_V2 = 0.0
        n_Q2 = 0.0
        n_VQ = 0.0
        for o in range(N):
            if p[o] == 0.0:
                continue
            a_mean = 0.0
            a_star = 0.0
            for t in range(T):
                value = V[o, tokens[c, t]]
                a_mean += value / T
                a_star += Q_star[t, k] * value
            spread = 0.0
            for t in range(T):
                d = V[o, tokens[c, t]] - a_mean - beta[t] + beta_mean
                spread += d * d
            nV = -(z[o] - vz)
            nQ = -((a_star - a_mean) - (beta_star - beta_mean))
            norm2_Q += p[o] * spread / mu[k]
            n_V += p[o] * nV
            n_Q += p[o] * nQ
            n_V2 += p[o] * nV * nV
            n_Q2 += p[o] * nQ * nQ
            n_VQ += p[o] * nV * nQ
        values[0] = (1.0 - 2.0 * pv + vv) * A
        values[1] = norm2_Q
        values[2] = n_V
        values[3] = n_Q
        values[4] = n_V2
        values[5] = n_Q2
        values[6] = n_VQ
        for m in range(7):
            sums[m] += values[m]
            squares[m] += values[m] * values[m]
        for m in range(n_present):
            y[present[m]] = 0.0
            ys[present[m]] = 0.0
            seen[present[m]] = False
    return sums, squares


def label_integrated_noise_sums(problem: SCBProblem, tokens, last, V, Q) -> tuple[np.ndarray, np.ndarray]:
    """Sums over contexts (``tokens`` (n, T) ints in [0, N), ``last`` (n,)) of the label-integrated moments
    NOISE_MOMENT_NAMES at (V, Q), and of their squares (docs/scb.md §14)."""
    V, Q = _check_V(problem, V), _check_Q(problem, Q)
    for name, value in (("V", V), ("Q", Q)):
        if float(np.max(np.abs(value))) > 1e75:  # fourth moments of V and Q: the terms must stay finite
            raise ValueError(f"{name} has entries of size {float(np.max(np.abs(value))):.3g}; at most 1e75 keeps "
                             "the noise moments finite")
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    last = np.ascontiguousarray(last, dtype=np.int64)
    if tokens.ndim != 2 or tokens.shape[1] != problem.T or last.shape != (tokens.shape[0],):
        raise ValueError(f"tokens must have shape (n, {problem.T}) and last shape (n,)")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= problem.N or last.min() < 0 or last.max() >= problem.N):
        raise ValueError(f"tokens and last must lie in [0, {problem.N})")
    return _label_integrated_noise(tokens, last, np.ascontiguousarray(V, dtype=float),
                                   np.ascontiguousarray(Q, dtype=float), problem.P, problem.Q_star, problem.mu)
