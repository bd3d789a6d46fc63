"""One-layer self-attention as a context-conditioned Markov chain (CCMC): the mathematics.

Paper: M. E. Ildiz, Y. Huang, Y. Li, A. S. Rawat, S. Oymak, *From Self-Attention to Markov Models: Unveiling the
Dynamics of Generative Transformers*, ICML 2024 (arXiv:2402.13512). "§k" refers to the sections of docs/ccmc.md,
where every formula here is derived.

Model (§1–2): tokens in [K], embeddings E (K × d, full row rank), key–query matrix W (d × d), tied head C with
CEᵀ = I_K, no output softmax. The transition logits are Θ_{a,k} = e_kᵀ W e_a and the base chain is
P = rowsoftmax(Θ). The output of the layer on a prompt X with last token a is the CCMC law (§3)

    Pr(y = k | X) = m_k P_{a,k} / Σ_j m_j P_{a,j},

with m the token counts of the keys: the whole prompt (``query="self"``, the default) or the prompt without its
last position (``query="exclude"``). Everything here is a function of (P, counts, last token); sampling and the
raw attention forward pass live in ``attnflow.dynamics.ccmc``.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit
from scipy import optimize

from . import checks as check
from .certificates import RankDecision, UncertifiedSolution, check_cut, rank_decision
from .lapack import DGESV, solve_into
from .parameters import Parameter, parse_parameters

__all__ = ["nll_and_gradient_kernel", "read_only_copy", "MAX_CHAIN_K", "MAX_UNIFORM_K", "CCMCProblem", "QUERY_VARIANTS", "GOLDEN_P", "CYCLE_P", "STOCHASTIC_TOLERANCE", "MAX_ENUMERATED_PROMPTS",
           "centred_logits", "chain_from_logits", "check_chain", "check_prompts", "key_counts", "ccmc_law",
           "positional_law", "nll_theta", "nll_gradient_theta", "all_prompts", "fisher_information", "fisher_rank",
           "fisher_rank_decision", "FISHER_RANK_CUT", "tangent_eigenvalues", "predicted_fisher_rank", "jacobians", "asymptotic_constants",
           "uniform_chain_constant", "polya_share_moments", "fitness_exponents", "diagonal_loser_exponents",
           "stationary_law_of_q", "invasion_rates", "fluid_rhs", "fluid_rhs_into", "pack_fluid_params",
           "equilibrium_on_support", "EQUILIBRIUM_TOLERANCE", "StabilityVerdict", "transversal_stability",
           "is_transversally_stable", "UncertifiedSolution", "diagonal_dominant_chain", "rank_one_chain",
           "nll_and_gradient_kernel", "read_only_copy"]

QUERY_VARIANTS = ("self", "exclude")
# Row sums of P are checked to this absolute tolerance.
STOCHASTIC_TOLERANCE = 1e-9
# Exact enumeration of all K^L prompts is allowed up to this many prompts (the Fisher information of §5.3).
MAX_ENUMERATED_PROMPTS = 2_000_000
# Eigenvalues of F below this fraction of the largest count as zero in its rank (§5.4); the pseudo-inverse of a block
# F_a (§5.5) drops those below PSEUDO_INVERSE_CUT of the block's largest.
FISHER_RANK_CUT = 1e-9
PSEUDO_INVERSE_CUT = 1e-10
# An equilibrium is accepted when max_{k∈S} |λ_k(f) − 1| is at most this (§6.5); λ is known to about this accuracy
# there, so a transversal-stability verdict with 1 − λ_k within it of 0 is not decided.
EQUILIBRIUM_TOLERANCE = 1e-9
# Largest K of a chain built from K alone (K × K entries), and of the uniform-chain constant (K pseudo-inverses of
# K × K matrices, O(K⁴)): beyond them a typo, not an experiment.
MAX_CHAIN_K = 2000
MAX_UNIFORM_K = 200

# The base chain of the MLE golden value (§5.5) and of the fluid-limit golden example (§6.5).
GOLDEN_P = np.array([[.4, .3, .2, .1], [.1, .4, .3, .2], [.2, .1, .4, .3], [.3, .2, .1, .4]])
CYCLE_P = np.array([[.10, .60, .15, .15], [.10, .10, .70, .10], [.65, .10, .10, .15], [.30, .30, .30, .10]])


def check_chain(P, name: str = "P") -> np.ndarray:
    """A read-only C-ordered K × K row-stochastic matrix with strictly positive entries (P = rowsoftmax(Θ) is never
    0); C order whatever the input's, so that the kernels compile one signature."""
    P = check.finite_array(P, name, ndim=2, order="C")
    if P.shape[0] != P.shape[1] or P.shape[0] < 2:
        raise ValueError(f"{name} must be a square K x K matrix with K >= 2, got shape {P.shape}")
    if np.any(P <= 0):
        raise ValueError(f"{name} must have strictly positive entries (it is a softmax of finite logits)")
    if np.abs(P.sum(axis=1) - 1).max() > STOCHASTIC_TOLERANCE:
        raise ValueError(f"{name} must be row-stochastic (rows summing to 1), got row sums {P.sum(axis=1)}")
    return P


def check_prompts(prompts, K: int, name: str = "prompts", *, query: str = "self") -> np.ndarray:
    """Prompts as an int64 array (n, L) of tokens in 0..K−1; L >= 1 (>= 2 when the query is excluded)."""
    try:
        array = np.array(prompts)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of integer tokens") from None
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] == 0 or array.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (n, L) array of tokens, got shape {array.shape}")
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise ValueError(f"{name} must hold integer tokens")
    elif array.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer tokens, got dtype {array.dtype}")
    array = array.astype(np.int64)
    if array.min() < 0 or array.max() >= K:
        raise ValueError(f"{name} must hold tokens in 0..{K - 1}, got values in {array.min()}..{array.max()}")
    if query not in QUERY_VARIANTS:
        raise ValueError(f"query must be one of {QUERY_VARIANTS}, got {query!r}")
    if query == "exclude" and array.shape[1] < 2:
        raise ValueError(f"{name} need length >= 2 when the query is excluded from the keys (no key is left)")
    return array


@dataclass(frozen=True)
class CCMCProblem:
    """A CCMC (§2–3): the base chain P (K × K, row-stochastic, > 0), the length L of i.i.d. uniform prompts used
    for learning (§5), the initial prompt X0 of a generated trajectory (§6) and the query variant (§2.2).
    X0 defaults to the first min(K, 4) tokens, (0, 1, 2, 3) for K >= 4, so that a chain of any size has a valid one."""

    P: np.ndarray
    L: int = 6
    X0: tuple | None = None
    query: str = "self"

    def __post_init__(self):
        P = check_chain(self.P, "P")
        object.__setattr__(self, "P", P)
        if self.query not in QUERY_VARIANTS:
            raise ValueError(f"query must be one of {QUERY_VARIANTS}, got {self.query!r}")
        object.__setattr__(self, "L", check.integer(self.L, "L", minimum=2 if self.query == "exclude" else 1))
        if self.X0 is None:
            object.__setattr__(self, "X0", tuple(range(min(self.K, 4))))
        X0 = check_prompts(self.X0, self.K, "X0", query=self.query)
        if X0.shape[0] != 1:
            raise ValueError(f"X0 must be one prompt (a list of tokens), got shape {X0.shape}")
        object.__setattr__(self, "X0", tuple(int(x) for x in X0[0]))

    PARAMETERS = (
        Parameter("P", "matrix", GOLDEN_P.tolist(), "base chain, rows ';'-separated (row-stochastic, > 0)",
                  minimum=0.0, maximum=1.0),
        Parameter("L", "integer", 6, "length of the i.i.d. uniform prompts the MLE learns from", minimum=1,
                  maximum=10_000),
        Parameter("X0", "vector", None, "initial prompt of a generated trajectory (tokens 0..K-1; default the "
                  "first min(K, 4) tokens)", minimum=0, maximum=100_000),
        Parameter("query", "choice", "self", "does the query attend to itself (self) or not (exclude)",
                  choices=QUERY_VARIANTS),
    )

    @classmethod
    def from_params(cls, values) -> "CCMCProblem":
        """A problem from named text or values (``PARAMETERS``)."""
        parsed = parse_parameters(cls.PARAMETERS, values, owner="ccmc")
        X0 = None if parsed["X0"] is None else np.asarray(parsed["X0"], float)
        if X0 is not None and not np.all(X0 == np.round(X0)):
            raise ValueError("parameter X0 must hold integer tokens")
        return cls(P=np.asarray(parsed["P"], float), L=parsed["L"],
                   X0=None if X0 is None else tuple(int(x) for x in X0), query=parsed["query"])

    @property
    def K(self) -> int:
        return self.P.shape[0]

    @cached_property
    def Theta(self) -> np.ndarray:
        """Row-centred logits Θ* = log P − row means (the gauge in which estimates are compared, §5.1)."""
        return centred_logits(np.log(self.P))

    @cached_property
    def initial_counts(self) -> np.ndarray:
        """m(0): token counts of X0 (all positions; the urn of §6 holds every token of the context)."""
        counts = np.bincount(np.array(self.X0), minlength=self.K).astype(np.int64)
        counts.setflags(write=False)
        return counts


def centred_logits(Theta) -> np.ndarray:
    """Θ with each row shifted to mean 0: the likelihood is invariant to row shifts Θ_{a,·} + c_a (§5.1)."""
    Theta = check.finite_array(Theta, "Theta")
    return Theta - Theta.mean(axis=-1, keepdims=True)


def chain_from_logits(Theta) -> np.ndarray:
    """P = rowsoftmax(Θ) (§1), with the log-sum-exp shift."""
    Theta = check.finite_array(Theta, "Theta")
    e = np.exp(Theta - Theta.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@njit(cache=True)
def _key_counts(prompts, K, exclude):
    n, L = prompts.shape
    counts = np.zeros((n, K), dtype=np.int64)
    stop = L - 1 if exclude else L
    for i in range(n):
        for j in range(stop):
            counts[i, prompts[i, j]] += 1
    return counts


def key_counts(prompts, K: int, query: str = "self") -> np.ndarray:
    """m(X) (n, K): counts of each token among the keys, all L positions (self) or the first L − 1 (exclude)."""
    prompts = check_prompts(prompts, K, query=query)
    return _key_counts(prompts, K, query == "exclude")


@njit(cache=True)
def _ccmc_law(P, counts, last):
    n, K = counts.shape
    out = np.empty((n, K))
    for i in range(n):
        total = 0.0
        for k in range(K):
            out[i, k] = counts[i, k] * P[last[i], k]
            total += out[i, k]
        for k in range(K):
            out[i, k] /= total
    return out


def ccmc_law(P, prompts, query: str = "self") -> np.ndarray:
    """Pr(y = k | X) = m_k P_{x_L,k} / Σ_j m_j P_{x_L,j} (§3, eq. 3.1), for each prompt.

    P : (K, K) row-stochastic; prompts : (n, L) tokens. Returns (n, K), rows in the simplex, zero off the keys'
    support (the copying property, §3.2)."""
    P = check_chain(P)
    prompts = check_prompts(prompts, P.shape[0], query=query)
    counts = _key_counts(prompts, P.shape[0], query == "exclude")
    return _ccmc_law(P, counts, np.ascontiguousarray(prompts[:, -1]))


def positional_law(base_logits_row, tokens, log_position_weights) -> np.ndarray:
    """The position-scaled CCMC law (§4, eq. 4.2): Pr(y = k) ∝ exp(Θ⁽ᴸ⁾_{a,k}) M_k with M_k = Σ_{i: x_i = k} ω(i).

    base_logits_row : (K,) the length-dependent logits e_kᵀW_ee e_a + e_kᵀW_ep p_L of the query a.
    tokens : (L,) the keys' tokens; log_position_weights : (L,) log ω(i) = p_iᵀW_pe e_a + p_iᵀW_pp p_L."""
    base = check.finite_array(base_logits_row, "base_logits_row", ndim=1)
    K = base.size
    tokens = check_prompts(tokens, K, "tokens")[0]
    log_omega = check.finite_array(log_position_weights, "log_position_weights", shape=tokens.shape)
    shift = log_omega.max()
    M = np.bincount(tokens, weights=np.exp(log_omega - shift), minlength=K)
    weights = np.exp(base - base.max()) * M
    return weights / weights.sum()


# ---------------------------------------------------------------------------------------------------------------
# Learning from i.i.d. prompts (§5)
# ---------------------------------------------------------------------------------------------------------------

@njit(cache=True)
def _nll_and_gradient(Theta, counts, last, y, weights):
    n, K = counts.shape
    grad = np.zeros((K, K))
    value = 0.0
    total_weight = 0.0
    p = np.empty(K)
    for i in range(n):
        a = last[i]
        shift = -np.inf
        for k in range(K):
            if counts[i, k] > 0 and Theta[a, k] > shift:
                shift = Theta[a, k]
        z = 0.0
        for k in range(K):
            p[k] = counts[i, k] * math.exp(Theta[a, k] - shift) if counts[i, k] > 0 else 0.0
            z += p[k]
        w = weights[i]
        value += w * (math.log(z) + shift - Theta[a, y[i]])
        for k in range(K):
            grad[a, k] += w * p[k] / z
        grad[a, y[i]] -= w
        total_weight += w
    for a in range(K):
        for k in range(K):
            grad[a, k] /= total_weight
    return value / total_weight, grad


def _learning_data(K, prompts, y, query, weights):
    prompts = check_prompts(prompts, K, query=query)
    y = np.asarray(y)
    if y.shape != (prompts.shape[0],) or y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= K:
        raise ValueError(f"y must hold one token in 0..{K - 1} per prompt ({prompts.shape[0]}), got shape {y.shape}")
    counts = _key_counts(prompts, K, query == "exclude")
    if np.any(counts[np.arange(y.size), y] == 0):
        raise ValueError("every y must be a key token of its prompt (the CCMC law gives other tokens probability 0)")
    if weights is None:
        weights = np.ones(y.size)
    weights = check.finite_array(weights, "weights", shape=y.shape)
    if np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    return counts, np.ascontiguousarray(prompts[:, -1]), y.astype(np.int64), np.ascontiguousarray(weights)


def _square_logits(Theta) -> np.ndarray:
    Theta = check.finite_array(Theta, "Theta", ndim=2, order="C")
    if Theta.shape[0] != Theta.shape[1]:
        raise ValueError(f"Theta must be K x K, got shape {Theta.shape}")
    return Theta


def nll_theta(Theta, prompts, y, query: str = "self", weights=None) -> float:
    """ℓ̂_n(Θ) = mean[log Σ_j m_j e^{Θ_{a,j}} − Θ_{a,y}] (§5.1, eq. 5.1): the raw model's negative log-likelihood
    plus mean(log m_y), convex in Θ. Theta : (K, K); prompts : (n, L); y : (n,)."""
    Theta = _square_logits(Theta)
    return float(_nll_and_gradient(Theta, *_learning_data(Theta.shape[0], prompts, y, query, weights))[0])


def nll_gradient_theta(Theta, prompts, y, query: str = "self", weights=None) -> np.ndarray:
    """∇_Θ ℓ̂_n (K, K): row a is the mean over samples with last token a of (p(·|X) − e_y) (§5.1, eq. 5.2)."""
    Theta = _square_logits(Theta)
    return _nll_and_gradient(Theta, *_learning_data(Theta.shape[0], prompts, y, query, weights))[1]


def nll_and_gradient_kernel(Theta, counts, last, y, weights):
    """The numba kernel behind :func:`nll_theta` for callers that hold validated sufficient statistics (the MLE
    loop): ``(value, gradient)``. The statistics must be of the kinds :func:`nll_theta` passes (writable C-ordered
    int64 ``counts``, ``last`` and ``y``; read-only C-ordered float64 ``weights``, see :func:`read_only_copy`):
    another kind of array is another signature, and so a second compilation of the kernel. Θ, which changes at every
    call, is copied here to the read-only C-ordered float64 array :func:`nll_theta` passes."""
    return _nll_and_gradient(read_only_copy(Theta), counts, last, y, weights)


def read_only_copy(values) -> np.ndarray:
    """A read-only C-ordered float64 copy of ``values``: the kind of array :func:`nll_and_gradient_kernel` takes."""
    array = np.array(values, dtype=np.float64, order="C")
    array.setflags(write=False)
    return array


def all_prompts(K: int, L: int) -> np.ndarray:
    """Every prompt in [K]^L (K^L, L), in lexicographic order; refused above ``MAX_ENUMERATED_PROMPTS``."""
    K = check.integer(K, "K", minimum=1)
    L = check.integer(L, "L", minimum=1)
    if K ** L > MAX_ENUMERATED_PROMPTS:
        raise ValueError(f"K^L = {K}^{L} prompts exceed the enumeration limit {MAX_ENUMERATED_PROMPTS}")
    return np.array(list(itertools.product(range(K), repeat=L)), dtype=np.int64).reshape(K ** L, L)


@njit(cache=True)
def _fisher(P, counts, last, weights):
    n, K = counts.shape
    F = np.zeros((K, K, K))
    p = np.empty(K)
    for i in range(n):
        a = last[i]
        z = 0.0
        for k in range(K):
            p[k] = counts[i, k] * P[a, k]
            z += p[k]
        for k in range(K):
            p[k] /= z
        for k in range(K):
            F[a, k, k] += weights[i] * p[k]
            for j in range(K):
                F[a, k, j] -= weights[i] * p[k] * p[j]
    return F


def fisher_information(P, prompts, query: str = "self", weights=None) -> np.ndarray:
    """Per-sample Fisher information of Θ, block-diagonal over the last token (§5.3, eq. 5.3):
    F_a = E[1{x_L = a}(diag p − ppᵀ)], p = p(·|X), the expectation over ``prompts`` with ``weights`` (default
    uniform, normalised to 1). Returns (K, K, K): F[a] is the block of row a of Θ."""
    P = check_chain(P)
    K = P.shape[0]
    prompts = check_prompts(prompts, K, query=query)
    weights = np.full(prompts.shape[0], 1.0 / prompts.shape[0]) if weights is None else \
        check.finite_array(weights, "weights", shape=(prompts.shape[0],))
    if np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    counts = _key_counts(prompts, K, query == "exclude")
    return _fisher(P, counts, np.ascontiguousarray(prompts[:, -1]), weights / weights.sum())


def fisher_rank_decision(F, relative_tolerance: float = FISHER_RANK_CUT) -> RankDecision:
    """Σ_a rank F_a (§5.4) with its certificate: eigenvalues of the blocks F_a below ``relative_tolerance`` × the
    largest count as 0, and the decision is certified when every eigenvalue not counted is round-off of an exact zero
    (:class:`~attnflow.closed_forms.certificates.RankDecision`: its smallest kept and largest dropped eigenvalues,
    relative to the largest, are the margin on either side of the cut)."""
    F = check.finite_array(F, "F", ndim=3)
    relative_tolerance = check_cut(relative_tolerance, "relative_tolerance")
    return rank_decision(np.linalg.eigvalsh(F), relative_tolerance)


def fisher_rank(F, relative_tolerance: float = FISHER_RANK_CUT) -> int:
    """Σ_a rank F_a, eigenvalues below ``relative_tolerance`` × the largest counted as 0; a rank whose cut falls
    between round-off and a genuine eigenvalue is undecided and raises :class:`UncertifiedSolution`
    (:func:`fisher_rank_decision`)."""
    return fisher_rank_decision(F, relative_tolerance).require("F")


def predicted_fisher_rank(prompts, K: int, query: str = "self") -> int:
    """rank F = Σ_a (|U_a| − #components(G_a)) (§5.4, eq. 5.4), from the support of the prompt law alone.

    U_a is the set of key tokens that ever occur with last token a, G_a the graph on U_a joining two tokens that
    occur in the keys of one prompt. With the query among the keys every G_a is a star around a (one component)."""
    prompts = check_prompts(prompts, K, query=query)
    keys = prompts if query == "self" else prompts[:, :-1]
    total = 0
    for a in range(K):
        parent = {}

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for row in np.unique(keys[prompts[:, -1] == a], axis=0):
            members = np.unique(row)
            for token in members:
                parent.setdefault(int(token), int(token))
            root = find(int(members[0]))
            for token in members[1:]:
                other = find(int(token))
                if other != root:
                    parent[other] = root
        components = len({find(x) for x in parent})
        total += len(parent) - components
    return total


def jacobians(P) -> np.ndarray:
    """J_a = diag P_a − P_a P_aᵀ (K, K, K): the Jacobian of the row softmax, dP_a = J_a dΘ_a (§5.5)."""
    P = check_chain(P)
    return np.einsum("ak,kj->akj", P, np.eye(P.shape[0])) - np.einsum("ak,aj->akj", P, P)


def asymptotic_constants(P, F) -> dict:
    """The asymptotic MLE error constants (§5.5, eq. 5.5): n E‖Θ̂ − Θ*‖²_F → Σ_a tr F_a⁺ (centred gauge) and
    n E‖P̂ − P*‖²_F → Σ_a tr(J_a F_a⁺ J_a). F : (K, K, K) from :func:`fisher_information`; needs full coverage
    (rank F_a = K − 1), else the error does not vanish. A block with an eigenvalue between round-off and the
    pseudo-inverse's cut raises :class:`UncertifiedSolution` (its inverse would be read off a rank decision that
    the arithmetic cannot make)."""
    P = check_chain(P)
    F = check.finite_array(F, "F", shape=(P.shape[0],) * 3)
    J = jacobians(P)
    # the pseudo-inverse decides each block's rank at its cut: certified, or UncertifiedSolution
    for a, values in enumerate(np.linalg.eigvalsh(F)):
        rank_decision(values, PSEUDO_INVERSE_CUT).require(f"F[{a}] (its pseudo-inverse)")
    F_plus = np.linalg.pinv(F, hermitian=True, rcond=PSEUDO_INVERSE_CUT)
    return dict(theta=float(np.trace(F_plus, axis1=1, axis2=2).sum()),
                chain=float(np.einsum("akj,ajl,alk->", J, F_plus, J)))


def uniform_chain_constant(K: int, L: int | None = None) -> float:
    """Σ_a tr(J_a F_a⁺ J_a) for a uniform P and i.i.d. uniform prompts of length L, query among the keys (§5.6):

    given x_L = a the counts are m = e_a + Mult(L − 1, u), u = 1/K, and p = m/L, so
    F_a = (1/K)[diag μ − μμᵀ − (L − 1)(diag u − uuᵀ)/L²] with μ = (e_a + (L − 1)u)/L. ``L=None`` gives the limit
    L → ∞, K(K − 1)."""
    K = check.integer(K, "K", minimum=2)
    if K > MAX_UNIFORM_K:
        raise ValueError(f"K must be <= {MAX_UNIFORM_K} (K pseudo-inverses of K x K matrices), got {K}")
    if L is None:
        return float(K * (K - 1))
    L = check.integer(L, "L", minimum=1)
    u = np.full(K, 1.0 / K)
    J = np.diag(u) - np.outer(u, u)
    total = 0.0
    for a in range(K):
        mu = ((L - 1) * u + np.eye(K)[a]) / L
        F = (np.diag(mu) - np.outer(mu, mu) - (L - 1) * J / L**2) / K
        total += float(np.trace(J @ np.linalg.pinv(F, hermitian=True, rcond=1e-10) @ J))
    return total


# ---------------------------------------------------------------------------------------------------------------
# A generated trajectory: urns and the fluid limit (§6)
# ---------------------------------------------------------------------------------------------------------------

def polya_share_moments(initial_counts, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean p_k and variance p_k(1 − p_k) t / ((L₀ + 1)(L₀ + t)) of the share f_k(t) = m_k(t)/(L₀ + t) when every
    row of P is uniform (the Pólya urn, §6.2, eq. 6.2)."""
    m0 = check.finite_array(initial_counts, "initial_counts", ndim=1)
    if np.any(m0 < 0) or m0.sum() <= 0:
        raise ValueError("initial_counts must be non-negative with a positive total")
    t = check.integer(t, "t", minimum=0)
    L0 = m0.sum()
    p = m0 / L0
    return p, p * (1 - p) * t / ((L0 + 1) * (L0 + t))


def rank_one_chain(v) -> np.ndarray:
    """P_{a,k} = v_k / Σv for every a: the fitness urn (§6.3)."""
    v = check.finite_array(v, "v", ndim=1)
    if np.any(v <= 0):
        raise ValueError("v must be positive")
    return np.tile(v / v.sum(), (v.size, 1))


def diagonal_dominant_chain(K: int, diagonal: float) -> np.ndarray:
    """P = p_diag I + (1 − p_diag)/(K − 1) (11ᵀ − I) (§6.4)."""
    K = check.integer(K, "K", minimum=2)
    if K > MAX_CHAIN_K:
        raise ValueError(f"K must be <= {MAX_CHAIN_K} (a K x K chain), got {K}")
    diagonal = check.real(diagonal, "diagonal", minimum=0.0, maximum=1.0, strict=True)
    if diagonal >= 1:
        raise ValueError("diagonal must be < 1 (every entry of P must be positive)")
    P = np.full((K, K), (1 - diagonal) / (K - 1))
    np.fill_diagonal(P, diagonal)
    return P


def fitness_exponents(v, support) -> np.ndarray:
    """λ_k = v_k / v_w for k in ``support``, w = argmax_{support} v (unique): m_k(t) ∝ t^{λ_k} (§6.3, eq. 6.3)."""
    v = check.finite_array(v, "v", ndim=1)
    support = np.unique(check_prompts(support, v.size, "support")[0])
    best = v[support].max()
    if np.sum(v[support] == best) != 1:
        raise ValueError("the winner argmax_{k in support} v_k must be unique")
    return v[support] / best


def diagonal_loser_exponents(P, winner: int) -> np.ndarray:
    """λ_k = P_{w,k} / P_{w,w} (§6.4): the growth exponents of the losers around the vertex e_w."""
    P = check_chain(P)
    winner = check.integer(winner, "winner", minimum=0)
    if winner >= P.shape[0]:
        raise ValueError(f"winner must be a token in 0..{P.shape[0] - 1}")
    return P[winner] / P[winner, winner]


@njit(cache=True)
def _stationary_law_of_q(f, P, dgesv):
    """π(f) by LAPACK's dgesv at the address ``dgesv`` (:mod:`.lapack`)."""
    K = f.size
    Z = np.empty(K)
    np.dot(P, f, Z)  # into a buffer: the BLAS call of np.dot(P, f), compiled once for the other kernels too
    # π solves πᵀ(Q − I) = 0 on the support of f, Σπ = 1; rows a outside the support are transient (π_a = 0).
    A = np.zeros((K, K))
    b = np.zeros(K)
    for a in range(K):
        for k in range(K):
            A[k, a] = f[k] * P[a, k] / Z[a] - (1.0 if a == k else 0.0)
    for k in range(K):
        if f[k] <= 0:
            for a in range(K):
                A[k, a] = 0.0
            A[k, k] = 1.0
    # replace the first support equation by the normalisation
    first = 0
    while f[first] <= 0:
        first += 1
    for a in range(K):
        A[first, a] = 1.0 if f[a] > 0 else 0.0
    b[first] = 1.0
    pi = np.empty(K)
    solve_into(dgesv, A, b, np.empty(K * K), np.empty(K, np.int32), pi)
    return pi


@njit(cache=True)
def _invasion_rates(f, P, dgesv):
    pi = _stationary_law_of_q(f, P, dgesv)
    K = f.size
    Z = np.empty(K)
    np.dot(P, f, Z)
    lam = np.zeros(K)
    for a in range(K):
        if pi[a] > 0:
            for k in range(K):
                lam[k] += pi[a] * P[a, k] / Z[a]
    return lam


def _check_shares(f, K):
    f = check.finite_array(f, "f", shape=(K,))
    if np.any(f < 0) or abs(f.sum() - 1) > 1e-8:
        raise ValueError("f must be a probability vector (shares of the context)")
    return np.array(f, order="C")  # writable, as the root finder's shares: one compiled signature


def stationary_law_of_q(f, P) -> np.ndarray:
    """π(f): the stationary law of the fast last-token chain Q_f(a, k) = f_k P_{a,k} / Z_a(f) (§6.5, eq. 6.5)."""
    P = check_chain(P)
    return _stationary_law_of_q(_check_shares(f, P.shape[0]), P, DGESV)


def invasion_rates(f, P) -> np.ndarray:
    """λ_k(f) = Σ_a π_a(f) P_{a,k} / Z_a(f) (§6.5, eq. 6.6): π_k = f_k λ_k, and a token absent from the context
    grows like t^{λ_k} near f."""
    P = check_chain(P)
    return _invasion_rates(_check_shares(f, P.shape[0]), P, DGESV)


def pack_fluid_params(P) -> np.ndarray:
    """P flattened with K in front: the ``params`` of :func:`fluid_rhs`."""
    P = check_chain(P)
    return np.concatenate([[float(P.shape[0])], P.ravel()])


@njit(cache=True)
def fluid_rhs_into(tau, f, params, out):
    """df/dτ = π(f) − f, τ = log t (§6.5, eq. 6.4), written into ``out`` (the integrator's calling convention);
    ``params`` from :func:`pack_fluid_params`. π(f) as in :func:`stationary_law_of_q` (f clipped at 0 and
    renormalised), solved by Gaussian elimination with partial pivoting on a K × (K + 1) work array."""
    K = int(params[0])
    work = np.empty((K, K + 2))  # [A | b | g]; P[a, k] = params[1 + a K + k], g_k = work[k, K + 1]
    G = K + 1
    total = 0.0
    for k in range(K):
        work[k, G] = max(f[k], 0.0)
        total += work[k, G]
    for k in range(K):
        work[k, G] /= total
    # A[k, a] = g_k P[a, k] / Z_a − δ_ak on the support, identity rows off it; row `first` is the normalisation
    for a in range(K):
        Z = 0.0
        for k in range(K):
            Z += params[1 + a * K + k] * work[k, G]
        for k in range(K):
            work[k, a] = work[k, G] * params[1 + a * K + k] / Z - (1.0 if a == k else 0.0)
    for k in range(K):
        work[k, K] = 0.0
        if work[k, G] <= 0:
            for a in range(K):
                work[k, a] = 0.0
            work[k, k] = 1.0
    first = 0
    while work[first, G] <= 0:
        first += 1
    for a in range(K):
        work[first, a] = 1.0 if work[a, G] > 0 else 0.0
    work[first, K] = 1.0
    for col in range(K):  # forward elimination with partial pivoting
        pivot = col
        for r in range(col + 1, K):
            if abs(work[r, col]) > abs(work[pivot, col]):
                pivot = r
        if pivot != col:
            for c in range(col, K + 1):
                work[col, c], work[pivot, c] = work[pivot, c], work[col, c]
        for r in range(col + 1, K):
            factor = work[r, col] / work[col, col]
            for c in range(col, K + 1):
                work[r, c] -= factor * work[col, c]
    for r in range(K - 1, -1, -1):  # back substitution: π into out, then π − f
        acc = work[r, K]
        for c in range(r + 1, K):
            acc -= work[r, c] * out[c]
        out[r] = acc / work[r, r]
    for k in range(K):
        out[k] -= f[k]


@njit(cache=True)
def fluid_rhs(tau, f, params):
    """df/dτ = π(f) − f, τ = log t (§6.5, eq. 6.4) as a new vector: :func:`fluid_rhs_into`."""
    out = np.empty(f.size)
    fluid_rhs_into(tau, f, params, out)
    return out


def equilibrium_on_support(P, support) -> np.ndarray:
    """The equilibrium f* with supp f* = S: λ_k(f*) = 1 for k ∈ S, solved by root finding from the uniform
    point of S (§6.5). Raises ValueError if no positive root is found."""
    P = check_chain(P)
    K = P.shape[0]
    S = np.unique(check_prompts(support, K, "support")[0])

    def shares(x):
        f = np.zeros(K)
        f[S] = np.exp(x - x.max())
        return f / f.sum()

    def residual(x):
        return _invasion_rates(shares(x), P, DGESV)[S] - 1.0

    solution = optimize.root(residual, np.zeros(S.size), method="hybr", options=dict(xtol=1e-13))
    f = shares(solution.x)
    if not solution.success or np.abs(residual(solution.x)).max() > EQUILIBRIUM_TOLERANCE:
        raise ValueError(f"no equilibrium with support {S.tolist()} found")
    return f


@dataclass(frozen=True)
class StabilityVerdict:
    """Transversal stability of an equilibrium f (§6.5) with its certificate: ``margin`` = 1 − max_{k ∉ supp f}
    λ_k(f) (+inf when f covers every token), ``residual`` = max_{k ∈ supp f} |λ_k(f) − 1| (how well f is an
    equilibrium) and ``tolerance``, the accuracy of λ below which the margin's sign is not decided."""

    margin: float
    residual: float
    tolerance: float

    @property
    def decided(self) -> bool:
        return abs(self.margin) > self.tolerance

    @property
    def stable(self) -> bool:
        """No absent token can invade (every λ_k < 1 off the support), read only from a decided verdict."""
        if not self.decided:
            raise UncertifiedSolution(
                f"f: an invasion rate off the support is within {self.tolerance:g} of 1 (margin {self.margin:.2g}); "
                "whether the token can invade is not decided at the accuracy of λ", self.margin)
        return self.margin > 0


def transversal_stability(P, f, *, tolerance: float = EQUILIBRIUM_TOLERANCE) -> StabilityVerdict:
    """The verdict of :func:`is_transversally_stable` with its margin (§6.5). ``f`` must be an equilibrium
    (|λ_k(f) − 1| ≤ EQUILIBRIUM_TOLERANCE on its support, as :func:`equilibrium_on_support` returns), else
    ValueError; a margin within ``tolerance`` of 0 leaves the verdict undecided."""
    P = check_chain(P)
    tolerance = check.real(tolerance, "tolerance", minimum=0.0)
    f = _check_shares(f, P.shape[0])
    lam = _invasion_rates(f, P, DGESV)
    inside = f > 0
    residual = float(np.abs(lam[inside] - 1).max())
    if residual > EQUILIBRIUM_TOLERANCE:
        raise ValueError(f"f is not an equilibrium: max |λ_k(f) − 1| on its support is {residual:.2g} > "
                         f"{EQUILIBRIUM_TOLERANCE:g} (equilibrium_on_support finds one)")
    margin = float(1 - lam[~inside].max()) if np.any(~inside) else np.inf
    return StabilityVerdict(margin, residual, tolerance)
def tangent_eigenvalues(P, f, step: float = 1e-6) -> np.ndarray:
    """The eigenvalues of the fluid limit's Jacobian at the shares f within the face of supp f (§6.5): the
    directions that keep the shares summing to 1 on the same support, by central differences of
    :func:`fluid_rhs` (an error O(step²)). An equilibrium f* attracts the runs near it on its face when every real
    part is negative, and repels them when one is positive (e.g. +0.4 three-fold at the uniform point of
    P = 0.55 I + 0.15(11ᵀ − I), K = 4, §6.4). Empty for a support of one token."""
    P = check_chain(P)
    K = P.shape[0]
    f = _check_shares(f, K)
    step = check.real(step, "step", minimum=0.0, strict=True, maximum=0.5)  # below every share of a 2-token support
    support = np.flatnonzero(f > 0)
    if support.size < 2:
        return np.empty(0)
    # an orthonormal basis of {x on supp f : Σx = 0}: the complement of 1 in a QR of [1 | I] on the support
    Q, _ = np.linalg.qr(np.column_stack([np.ones(support.size), np.eye(support.size)[:, :-1]]))
    basis = np.zeros((K, support.size - 1))
    basis[support] = Q[:, 1:]
    if step >= f[support].min():
        raise ValueError(f"step {step:g} must be below the smallest share on the support, {f[support].min():g}")
    params = pack_fluid_params(P)
    columns = [(fluid_rhs(0.0, f + step * b, params) - fluid_rhs(0.0, f - step * b, params)) / (2 * step)
               for b in basis.T]
    return np.linalg.eigvals(basis.T @ np.column_stack(columns))


def is_transversally_stable(P, f) -> bool:
    """True when every token outside supp f has λ_k(f) < 1: no absent token can invade (§6.5). ``f`` must be an
    equilibrium; a rate within EQUILIBRIUM_TOLERANCE of 1 raises :class:`UncertifiedSolution`
    (:func:`transversal_stability` returns the margin)."""
    return transversal_stability(P, f).stable
