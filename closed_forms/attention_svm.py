"""Attention as a max-margin token selector: the SVM problems, token optimality and the stable loss.

Tarzanagh, Li, Zhang & Oymak, *Max-Margin Token Selection in Attention Mechanism* (NeurIPS 2023) and Tarzanagh,
Li, Thrampoulidis & Oymak, *Transformers as Support Vector Machines* (2023). The derivations are in
docs/attention_svm.md; section numbers below (§k) refer to that page.

Every model here has *linear logits* (§2): token t of input i gets the logit ``l_it = <Φ_it, θ>``, with

* the prompt model ``f(X) = <X v, S(X W p)>``: ``θ = p``, ``Φ_it = W^T x_it`` (the key of token t);
* the cross-attention model ``f(X, z) = v^T X^T S(X W z)``: ``θ = vec(W)``, ``Φ_it = vec(x_it z_i^T)``.

Everything is written once for θ. The (K, Q) factorisation is the cross model composed with ``W = K Q^T``.
No randomness beyond the seeded instance constructors, no I/O, no plotting.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from attnflow import seeding
from attnflow.closed_forms import checks as check
from attnflow.closed_forms.certificates import ROUND_OFF, UncertifiedSolution, check_cut, rank_decision
from attnflow.closed_forms.max_margin import equality_ldp, ldp, nuclear_program
from attnflow.closed_forms.parameters import Parameter, parse_parameters
from attnflow.closed_forms.logit_losses import LOG_LOSS_CODE, LOSS_CODE, LOSSES, log_scaled_logit_gradient

__all__ = ["log_abs_loss_derivative", "AttentionSVMProblem", "LOSSES", "LOG_LOSS_CODE", "INSTANCES", "SVMSolution", "constraint_rows", "svm", "ldp",
           "nuclear_svm", "frobenius_svm", "support_tokens", "is_locally_optimal", "offset_prediction",
           "relaxed_svm", "value_svm", "loss_and_gradient", "log_scaled_logit_gradient", "kernel_labels", "logits",
           "corr", "two_token_offset", "single_input_svm", "rank", "SelectionSVM", "selection_rows",
           "selection_svm", "selection_offset", "certified_svm", "UncertifiedSolution", "NUC_GAP",
           "DECISION_NUC_ITERATIONS", "measured_offset", "log_gradient_norm",
           "log_abs_loss_derivative"]

INSTANCES = ("random", "single_global", "single_local", "multi_input", "two_token", "joint_tight", "joint_relaxed")
MAX_N, MAX_T, MAX_D = 200, 64, 64
# A constraint counts as active (a support token) when its margin is within this of 1 (§4). The Frobenius SVM is
# exact to round-off (≈1e-15); the nuclear one is certified to a relative duality gap ``NUC_GAP``.
ACTIVE_TOL_FRO = 1e-7
ACTIVE_TOL_NUC = 1e-4
NUC_GAP = 1e-8
# The nuclear solver's iteration budget when a decision is read off its answer (support tokens, local optimality):
# near-infeasible instances (n = T = 5, d = 3) need up to ~6e5 PDHG iterations (20 s) to certify the gap.
DECISION_NUC_ITERATIONS = 1_000_000
MAX_NUC_ITERATIONS = 100_000_000


@dataclass(frozen=True)
class AttentionSVMProblem:
    """A finite data set for one-layer attention with linear logits (§1–§2).

    X : (n, T, d) tokens x_it.  Y : (n,) labels ±1.  v : (d,) the value head.
    Z : (n, d) queries z_i of the cross-attention model, or ``None`` for the prompt model.
    Wk : (d, d) the fixed key map W of the prompt model (keys k_it = W^T x_it); identity when ``None``.
    loss : ``logistic`` (log(1 + e^{-u})), ``linear`` (−u) or ``exp`` (e^{-u}) — ℓ of eq. (2.2).
    """

    X: np.ndarray
    Y: np.ndarray
    v: np.ndarray
    Z: np.ndarray | None = None
    Wk: np.ndarray | None = None
    loss: str = "logistic"
    name: str = field(default="custom", compare=False)

    PARAMETERS = (
        Parameter("instance", "choice", "random", "which data set: a random instance (§7.1) or one of the toys",
                  choices=INSTANCES),
        Parameter("n", "integer", 6, "inputs (random instance)", minimum=1, maximum=MAX_N),
        Parameter("T", "integer", 8, "tokens per input (random instance)", minimum=2, maximum=MAX_T),
        Parameter("d", "integer", 10, "embedding dimension (random instance)", minimum=1, maximum=MAX_D),
        Parameter("instance_seed", "integer", 0, "seed of the random instance", minimum=0, maximum=2**63 - 1),
        Parameter("model", "choice", "cross", "random instance: cross-attention (θ = W) or prompt (θ = p)",
                  choices=("cross", "prompt")),
        Parameter("loss", "choice", "logistic", "the loss ℓ", choices=LOSSES),
        Parameter("C", "real", 1.0, "the two-token toy's value C", minimum=0.0, strict=True, maximum=1e3),
    )

    def __post_init__(self):
        X = check.finite_array(self.X, "X", ndim=3)
        n, T, d = X.shape
        if not (1 <= n <= MAX_N and 2 <= T <= MAX_T and 1 <= d <= MAX_D):
            raise ValueError(f"X must have 1 ≤ n ≤ {MAX_N}, 2 ≤ T ≤ {MAX_T}, 1 ≤ d ≤ {MAX_D}; got shape {X.shape}")
        Y = check.finite_array(self.Y, "Y", shape=(n,))
        if not np.all(np.abs(Y) == 1):
            raise ValueError("Y must hold labels ±1")
        v = check.finite_array(self.v, "v", shape=(d,))
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "Y", Y)
        object.__setattr__(self, "v", v)
        if self.Z is not None:
            object.__setattr__(self, "Z", check.finite_array(self.Z, "Z", shape=(n, d)))
            if self.Wk is not None:
                raise ValueError("Wk (the prompt model's key map) must be None when Z (cross-attention) is given")
        else:
            Wk = np.eye(d) if self.Wk is None else self.Wk
            object.__setattr__(self, "Wk", check.finite_array(Wk, "Wk", shape=(d, d)))
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")

    # ---- derived quantities --------------------------------------------------------------------------------

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def T(self) -> int:
        return self.X.shape[1]

    @property
    def d(self) -> int:
        return self.X.shape[2]

    @property
    def model(self) -> str:
        return "prompt" if self.Z is None else "cross"

    @property
    def P(self) -> int:
        """Dimension of θ: d (prompt) or d² (cross)."""
        return self.d if self.Z is None else self.d * self.d

    @functools.cached_property
    def features(self) -> np.ndarray:
        """Φ (n, T, P): ``l_it = <Φ_it, θ>`` (§2.1)."""
        if self.Z is None:
            phi = self.X @ self.Wk
        else:
            phi = np.einsum("ita,ib->itab", self.X, self.Z).reshape(self.n, self.T, self.P)
        phi = np.ascontiguousarray(phi)
        phi.setflags(write=False)
        return phi

    @functools.cached_property
    def scores(self) -> np.ndarray:
        """Token scores γ_it = Y_i v^T x_it (§1)."""
        gamma = self.Y[:, None] * (self.X @ self.v)
        gamma.setflags(write=False)
        return gamma

    @functools.cached_property
    def opt(self) -> np.ndarray:
        """The globally optimal tokens opt_i = argmax_t γ_it; ValueError if one is not unique (§1)."""
        gamma = self.scores
        best = np.argmax(gamma, axis=1)
        top = np.sort(gamma, axis=1)
        if np.any(top[:, -1] - top[:, -2] <= 1e-12 * max(1.0, np.abs(gamma).max())):
            raise ValueError("the optimal token is not unique in some input (equal top scores γ_it)")
        best.setflags(write=False)
        return best

    def theta_shape(self) -> tuple:
        return (self.d,) if self.Z is None else (self.d, self.d)

    # ---- constructors --------------------------------------------------------------------------------------

    @classmethod
    def from_params(cls, values) -> "AttentionSVMProblem":
        p = parse_parameters(cls.PARAMETERS, values, owner="attention_svm")
        name = p["instance"]
        if name == "random":
            return cls.random(p["n"], p["T"], p["d"], seed=p["instance_seed"], model=p["model"], loss=p["loss"])
        if name == "two_token":
            return cls.two_token(p["C"], loss=p["loss"])
        return getattr(cls, name)(loss=p["loss"])

    @classmethod
    def random(cls, n: int, T: int, d: int, *, seed: seeding.SeedLike, model: str = "cross",
               loss: str = "logistic") -> "AttentionSVMProblem":
        """The random instance of the cross-attention experiments (§7.1): v, x_it, z_i uniform on the unit sphere,
        Y_i = ±1 with probability ½ each. ``model="prompt"`` drops Z (keys = tokens)."""
        n = check.integer(n, "n", minimum=1)
        T = check.integer(T, "T", minimum=2)
        d = check.integer(d, "d", minimum=1)
        if n > MAX_N or T > MAX_T or d > MAX_D:
            raise ValueError(f"n, T, d must be at most {MAX_N}, {MAX_T}, {MAX_D}; got {n}, {T}, {d}")
        if model not in ("cross", "prompt"):
            raise ValueError(f"model must be cross or prompt, got {model!r}")
        rng = np.random.default_rng(seeding.as_seed_sequence(seed))
        v = rng.normal(size=d)
        v /= np.linalg.norm(v)
        Y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
        X = rng.normal(size=(n, T, d))
        X /= np.linalg.norm(X, axis=-1, keepdims=True)
        Z = rng.normal(size=(n, d))
        Z /= np.linalg.norm(Z, axis=-1, keepdims=True)
        return cls(X, Y, v, Z if model == "cross" else None, None, loss, name=f"random n={n} T={T} d={d}")

    @classmethod
    def single_global(cls, loss: str = "logistic") -> "AttentionSVMProblem":
        """Single input, T = d = 3 (§7.2): non-optimal scores 0.9, 0.9 — every init goes to p^mm(opt)."""
        return cls._single(0.9, loss, "single_global")

    @classmethod
    def single_local(cls, loss: str = "logistic") -> "AttentionSVMProblem":
        """Single input (§7.2) with the third token's score 0: token 1 becomes locally optimal."""
        return cls._single(0.0, loss, "single_local")

    @classmethod
    def _single(cls, gamma2: float, loss: str, name: str) -> "AttentionSVMProblem":
        X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, gamma2]]])
        return cls(X, np.ones(1), np.array([0.0, 0.0, 1.0]), None, np.diag([1.0, 1.0, 0.0]), loss, name=name)

    @classmethod
    def multi_input(cls, loss: str = "logistic") -> "AttentionSVMProblem":
        """n = 3 inputs of T = 7 tokens in d = 3 (§7.3): Gaussian clusters of scale 0.2 around (1,0), (−1,1) and
        (−½,−½); the value channel is 1 on token 0 and ½ elsewhere. Drawn from the fixed seed 0."""
        rng = np.random.default_rng(seeding.as_seed_sequence(0))
        X = 0.2 * rng.normal(size=(3, 7, 3))
        X[:, 0] += (1.0, 0.0, 0.0)
        X[:, 1:4] += (-1.0, 1.0, 0.0)
        X[:, 4:] += (-0.5, -0.5, 0.0)
        X[:, 0, 2] = 1.0
        X[:, 1:, 2] = 0.5
        return cls(X, np.ones(3), np.array([0.0, 0.0, 1.0]), None, np.diag([1.0, 1.0, 0.0]), loss,
                   name="multi_input")

    @classmethod
    def two_token(cls, C: float = 1.0, loss: str = "logistic") -> "AttentionSVMProblem":
        """X_1 = [(0,0,0), (1,1,C)], X_2 = [(0,0,0), (1,−1,1)], v = e_3, keys diag(1,1,0) (§7.4)."""
        C = check.real(C, "C", minimum=0.0, strict=True)
        X = np.array([[[0.0, 0.0, 0.0], [1.0, 1.0, C]], [[0.0, 0.0, 0.0], [1.0, -1.0, 1.0]]])
        return cls(X, np.ones(2), np.array([0.0, 0.0, 1.0]), None, np.diag([1.0, 1.0, 0.0]), loss,
                   name=f"two_token C={C:g}")

    @classmethod
    def joint_tight(cls, loss: str = "logistic") -> "AttentionSVMProblem":
        """Joint (v, p) toy (§7.5), all three inputs support vectors of the value SVM."""
        return cls._joint(1.0, loss, "joint_tight")

    @classmethod
    def joint_relaxed(cls, loss: str = "logistic") -> "AttentionSVMProblem":
        """Joint (v, p) toy (§7.5), input 3 is not a support vector of the value SVM."""
        return cls._joint(1.5, loss, "joint_relaxed")

    @classmethod
    def _joint(cls, last: float, loss: str, name: str) -> "AttentionSVMProblem":
        X = np.array([[[0.0, 0.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, -1.0]], [[0.0, 0.0], [0.5, last]]])
        return cls(X, np.array([1.0, -1.0, 1.0]), np.array([0.0, 1.0]), None, None, loss, name=name)

    def with_value(self, v) -> "AttentionSVMProblem":
        """The same data with another value head v."""
        return AttentionSVMProblem(self.X, self.Y, v, self.Z, self.Wk, self.loss, name=self.name)


# ==================================================================================================
# The SVM problems (§3)
# ==================================================================================================


def _alpha(problem: AttentionSVMProblem, alpha) -> np.ndarray:
    if alpha is None:
        return np.asarray(problem.opt)
    alpha = np.asarray(alpha)
    if alpha.shape != (problem.n,) or not np.issubdtype(alpha.dtype, np.integer):
        raise ValueError(f"alpha must be {problem.n} integer token indices, got {alpha!r}")
    if np.any(alpha < 0) or np.any(alpha >= problem.T):
        raise ValueError(f"alpha must index tokens 0..{problem.T - 1}, got {alpha.tolist()}")
    return alpha


def constraint_rows(problem: AttentionSVMProblem, alpha=None) -> tuple[np.ndarray, np.ndarray]:
    """M_j = Φ_{iα_i} − Φ_it for j = (i, t), t ≠ α_i (§3): returns (M (m, P), index (m, 2))."""
    alpha = _alpha(problem, alpha)
    phi = problem.features
    rows, index = [], []
    for i in range(problem.n):
        for t in range(problem.T):
            if t != alpha[i]:
                rows.append(phi[i, alpha[i]] - phi[i, t])
                index.append((i, t))
    return np.array(rows), np.array(index, dtype=np.int64)


@dataclass(frozen=True)
class SVMSolution:
    """A hard-margin SVM solution (§3): ``theta`` (None when infeasible), multipliers ``lam`` with
    θ = Σ_j λ_j M_j (Frobenius) or the certified dual (nuclear), the active set, the margins <M_j, θ> and a
    certificate: the Farkas vector of infeasibility, or the nuclear duality gap."""

    feasible: bool
    theta: np.ndarray | None
    lam: np.ndarray | None
    rows: np.ndarray
    index: np.ndarray
    norm: str
    active: np.ndarray | None = None
    margins: np.ndarray | None = None
    gap: float = 0.0
    certificate: np.ndarray | None = None
    iterations: int = 0
    requested_gap: float = 0.0  # the nuclear solver's target: an active set is trusted only at or below it

    @property
    def certified(self) -> bool:
        """The solution is what it says: the Frobenius SVM always (exact to round-off), the nuclear one when its
        duality gap reached the requested gap (its active set read at ``ACTIVE_TOL_NUC`` is then trusted)."""
        return self.norm == "fro" or self.gap <= self.requested_gap

    @property
    def accuracy(self) -> float:
        """The scale of the solver's error, relative to the largest singular value: 0 for the Frobenius SVM (exact to
        round-off), gap·||W||_*/σ_max for the nuclear one (gap·||W||_* bounds how far ||W||_* lies above the optimum,
        so a singular value below it cannot be told from the solver's error). :func:`rank` takes it. A gap just
        below 0 (−1e-16 at convergence: weak duality holds exactly, the difference is round-off) counts as 0."""
        if self.norm == "fro" or not self.feasible:
            return 0.0
        s = np.linalg.svd(self.theta, compute_uv=False)
        return float(max(self.gap, 0.0) * s.sum() / s[0]) if s[0] > 0 else 0.0

    @property
    def value(self) -> float:
        """||θ^mm|| in the problem's norm."""
        if not self.feasible:
            return float("inf")
        if self.norm == "nuc":
            return float(np.linalg.svd(self.theta, compute_uv=False).sum())
        return float(np.linalg.norm(self.theta))


def frobenius_svm(problem: AttentionSVMProblem, alpha=None, *, h=None) -> SVMSolution:
    """Att-SVM / W-SVM: min ||θ||_2 (||W||_F) s.t. <M_j, θ> ≥ h_j (h = 1: §3), exact to round-off via :func:`ldp`."""
    M, index = constraint_rows(problem, alpha)
    h = np.ones(len(M)) if h is None else np.asarray(h, float)
    feasible, x, lam = ldp(M, h)
    if not feasible:
        return SVMSolution(False, None, None, M, index, "fro", certificate=x)
    margins = M @ x
    active = (np.abs(margins - h) <= ACTIVE_TOL_FRO * max(1.0, np.abs(h).max())) & (h > 0)
    theta = x.reshape(problem.theta_shape())
    return SVMSolution(True, theta, lam, M, index, "fro", active=active, margins=margins)


def nuclear_svm(problem: AttentionSVMProblem, alpha=None, *, gap: float = NUC_GAP,
                max_iterations: int = 20_000) -> SVMSolution:
    """Nuclear W-SVM min ||W||_* s.t. <M_j, W> ≥ 1 (§3.2) by primal–dual hybrid gradient (Chambolle & Pock 2011)
    with singular-value thresholding, stopped at a certified relative duality gap ``gap``.

    Dual: max 1^T λ s.t. ||Σ λ_j M_j||_op ≤ 1, λ ≥ 0. Lower bound 1^T λ/||A^*λ||_op at λ = −y; upper bound
    ||W||_*/min_j <M_j, W> (W rescaled to feasibility). The Frobenius solution decides feasibility first."""
    if problem.Z is None:
        raise ValueError("the nuclear-norm SVM needs the cross-attention model (Z given): θ = W is a matrix")
    fro = frobenius_svm(problem, alpha)
    if not fro.feasible:
        return SVMSolution(False, None, None, fro.rows, fro.index, "nuc", certificate=fro.certificate)
    M, index = fro.rows, fro.index
    d = problem.d
    out = nuclear_program(M, (d, d), fro.theta, fro.lam, gap=gap, max_iterations=max_iterations)
    if out is None:
        raise ValueError("the nuclear SVM found no feasible iterate (degenerate constraints)")
    active = np.abs(out["margins"] - 1.0) <= ACTIVE_TOL_NUC
    return SVMSolution(True, out["theta"], out["lam"], M, index, "nuc", active=active, margins=out["margins"],
                       gap=out["gap"], iterations=out["iterations"], requested_gap=gap)


def svm(problem: AttentionSVMProblem, alpha=None, norm: str = "fro", *, gap: float = NUC_GAP,
        max_iterations: int = 20_000) -> SVMSolution:
    """The hard-margin SVM of token choice α (default opt) in the Frobenius (``fro``) or nuclear (``nuc``) norm;
    ``gap`` and ``max_iterations`` are the nuclear solver's (:func:`nuclear_svm`)."""
    if norm == "fro":
        return frobenius_svm(problem, alpha)
    if norm == "nuc":
        gap = check.real(gap, "gap", minimum=0.0, strict=True, maximum=1.0)
        max_iterations = check.integer(max_iterations, "max_iterations", minimum=25)
        if max_iterations > MAX_NUC_ITERATIONS:
            raise ValueError(f"max_iterations must be <= {MAX_NUC_ITERATIONS:.0e} (hours of PDHG), got {max_iterations}")
        return nuclear_svm(problem, alpha, gap=gap, max_iterations=max_iterations)
    raise ValueError(f"norm must be fro or nuc, got {norm!r}")


def certified_svm(problem: AttentionSVMProblem, alpha=None, norm: str = "fro", *, gap: float = NUC_GAP,
                  max_iterations: int = DECISION_NUC_ITERATIONS) -> SVMSolution:
    """:func:`svm` for a caller that reads a decision off the solution: a nuclear solution whose duality gap is still
    above ``gap`` after ``max_iterations`` raises :class:`UncertifiedSolution` with the gap it reached."""
    sol = svm(problem, alpha, norm, gap=gap, max_iterations=max_iterations)
    if sol.feasible and not sol.certified:
        raise UncertifiedSolution(
            f"the nuclear SVM stopped at relative duality gap {sol.gap:.2g} after {sol.iterations} iterations, above "
            f"the gap={sol.requested_gap:g} that certifies its active set; pass max_iterations > {sol.iterations} "
            "(or a larger gap) to decide", sol.gap)
    return sol


def rank(W, relative: float = 1e-5, *, accuracy: float = 0.0) -> int:
    """Numerical rank: singular values above ``relative``·σ_max (§3.2). A decision, so certified: a singular value
    below the cut must be a zero to the accuracy W is known, at most max(``certificates.ROUND_OFF``, ``accuracy``)·σ_max
    (``accuracy``: a solver's, :attr:`SVMSolution.accuracy`); one above it is a genuine small value that the cut would
    read as zero, and raises :class:`UncertifiedSolution` instead."""
    W = check.finite_array(W, "W")
    if W.ndim not in (1, 2):
        raise ValueError(f"W must be a vector or a matrix, got shape {W.shape}")
    relative = check_cut(relative, "relative")
    accuracy = check.real(accuracy, "accuracy", minimum=0.0)
    s = np.linalg.svd(np.atleast_2d(W), compute_uv=False)
    return rank_decision(s, relative, max(ROUND_OFF, accuracy)).require("rank")


def support_tokens(problem: AttentionSVMProblem, alpha=None, norm: str = "fro", *, gap: float = NUC_GAP,
                   max_iterations: int = DECISION_NUC_ITERATIONS) -> list[list[int]]:
    """T_i(α) = {t ≠ α_i : <M_it, θ^mm_α> = 1}, the active constraints (§4); ValueError if the SVM is infeasible.
    With the nuclear norm the active set is read only from a certified solution (:func:`certified_svm`: the
    solver iterates up to ``max_iterations`` for the duality gap ``gap``, else raises :class:`UncertifiedSolution`)."""
    sol = certified_svm(problem, alpha, norm, gap=gap, max_iterations=max_iterations)
    if not sol.feasible:
        raise ValueError("alpha: the SVM of this token choice is infeasible, it has no support tokens")
    found = [[] for _ in range(problem.n)]
    for (i, t), on in zip(sol.index, sol.active):
        if on:
            found[i].append(int(t))
    return found


def is_locally_optimal(problem: AttentionSVMProblem, alpha=None, norm: str = "fro", *, gap: float = NUC_GAP,
                       max_iterations: int = DECISION_NUC_ITERATIONS) -> bool:
    """α is locally optimal iff its SVM is feasible and γ_{iα_i} > γ_it for every support token t ∈ T_i(α) (§4);
    with the nuclear norm only from a certified solution, as :func:`support_tokens`."""
    alpha = _alpha(problem, alpha)
    sol = certified_svm(problem, alpha, norm, gap=gap, max_iterations=max_iterations)
    if not sol.feasible:
        return False
    gamma = problem.scores
    return all(gamma[i, alpha[i]] > gamma[i, t] for (i, t), on in zip(sol.index, sol.active) if on)


def log_abs_loss_derivative(u, loss: str):
    """log|ℓ'(u)|: logistic −log(1 + e^u), linear 0, exponential −u."""
    u = check.finite_array(u, "u")
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    if loss == "logistic":
        return -np.logaddexp(0.0, u)
    if loss == "linear":
        return np.zeros_like(u)
    return -u


def offset_prediction(problem: AttentionSVMProblem, alpha=None) -> np.ndarray:
    """The finite offset ρ* of GD/NGD iterates θ_k = r_k θ̂^mm + ρ* + … (§6.2).

    ρ* = Σ_{j∈S} β_j M_j with <M_j, ρ*> = b_j + c, b_j = log(|ℓ'(γ_iα)|(γ_iα − γ_it)/λ_j), and <θ^mm, ρ*> = 0:
    the (|S|+1)-dimensional system Gβ − c1 = b, λ^T G β = 0 with G the Gram matrix of the support rows.
    ValueError when the prediction does not exist: infeasible SVM, a support token with γ_it ≥ γ_iα (α not
    locally optimal), a zero multiplier on an active row, or linearly dependent support rows."""
    alpha = _alpha(problem, alpha)
    sol = frobenius_svm(problem, alpha)
    if not sol.feasible:
        raise ValueError("alpha: the SVM is infeasible, there is no offset")
    S = np.flatnonzero(sol.active)
    lam = sol.lam[S]
    if np.any(lam <= 1e-9 * max(1.0, sol.lam.max())):
        raise ValueError("alpha: degenerate SVM (an active constraint has multiplier 0), the offset is undefined")
    gamma = problem.scores
    i, t = sol.index[S, 0], sol.index[S, 1]
    gap = gamma[i, alpha[i]] - gamma[i, t]
    if np.any(gap <= 0):
        raise ValueError("alpha is not locally optimal: a support token scores at least as high")
    M = sol.rows[S]
    G = M @ M.T
    if np.linalg.matrix_rank(G, tol=1e-10 * max(1.0, np.abs(G).max())) < len(S):
        raise ValueError("alpha: the support rows are linearly dependent, the offset is not unique")
    b = log_abs_loss_derivative(gamma[i, alpha[i]], problem.loss) + np.log(gap) - np.log(lam)
    k = len(S)
    system = np.zeros((k + 1, k + 1))
    system[:k, :k] = G
    system[:k, k] = -1.0
    system[k, :k] = lam @ G
    rhs = np.concatenate([b, [0.0]])
    beta = np.linalg.solve(system, rhs)[:k]
    return (beta @ M).reshape(problem.theta_shape())


def measured_offset(solution: SVMSolution, theta) -> np.ndarray:
    """The measured offset ρ = Π_V θ − <θ, θ̂^mm> θ̂^mm of an iterate θ (§6.2): its part in V = span{M_j : j ∈ S},
    S the active set of the SVM ``solution`` (of the token choice θ selects), minus its part along θ^mm. Along GD or
    NGD it converges to ρ* (:func:`offset_prediction`). Returns an array of θ's shape. Refuses an infeasible
    solution (ValueError) and reads the active set only from a certified one (:class:`UncertifiedSolution`)."""
    if not solution.feasible:
        raise ValueError("solution: the SVM is infeasible, there is no offset")
    if not solution.certified:
        raise UncertifiedSolution(f"solution: the nuclear SVM's gap {solution.gap:.2g} is above the gap="
                                  f"{solution.requested_gap:g} that certifies its active set", solution.gap)
    theta = check.finite_array(theta, "theta")
    if theta.size != solution.theta.size:
        raise ValueError(f"theta must have {solution.theta.size} entries (the SVM's θ), got shape {theta.shape}")
    basis, _ = np.linalg.qr(solution.rows[solution.active].T)
    hat = solution.theta.ravel() / np.linalg.norm(solution.theta)
    flat = theta.ravel()
    return (basis @ (basis.T @ flat) - (flat @ hat) * hat).reshape(theta.shape)


def two_token_offset(C: float, loss: str) -> float:
    """Closed form of §6.2 for the two-token toy: p2* = ½ log(C|ℓ'(C)|/|ℓ'(1)|)."""
    C = check.real(C, "C", minimum=0.0, strict=True)
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    return 0.5 * (np.log(C) + float(log_abs_loss_derivative(C, loss)) - float(log_abs_loss_derivative(1.0, loss)))


def single_input_svm(alpha: int) -> np.ndarray:
    """Closed forms of the single-input toy (§7.2): p^mm(opt = 0) = (−0.1, 1, 0)/1.01 and p^mm(α = 1) = (1, 0, 0)."""
    if alpha == 0:
        return np.array([-0.1, 1.0, 0.0]) / 1.01
    if alpha == 1:
        return np.array([1.0, 0.0, 0.0])
    raise ValueError(f"alpha must be 0 or 1, got {alpha!r}")


def value_svm(problem: AttentionSVMProblem, alpha=None) -> np.ndarray:
    """v^mm = argmin ||v|| s.t. Y_i v^T x_{iα_i} ≥ 1 (the value SVM of joint training, §4)."""
    alpha = _alpha(problem, alpha)
    G = problem.Y[:, None] * problem.X[np.arange(problem.n), alpha]
    feasible, v, _ = ldp(G, np.ones(problem.n))
    if not feasible:
        raise ValueError("alpha: the value SVM on the selected tokens is infeasible")
    return v


def relaxed_svm(problem: AttentionSVMProblem, alpha=None) -> SVMSolution:
    """p^relax (§4): margin ≥ 1 on the inputs that are support vectors of the value SVM, ≥ 0 on the others."""
    alpha = _alpha(problem, alpha)
    v_mm = value_svm(problem, alpha)
    margins = problem.Y * (problem.X[np.arange(problem.n), alpha] @ v_mm)
    support = np.abs(margins - 1.0) <= 1e-7
    M, index = constraint_rows(problem, alpha)
    h = np.where(support[index[:, 0]], 1.0, 0.0)
    return frobenius_svm(problem, alpha, h=h)


# ==================================================================================================
# Several selected tokens per input: the SVM-equivalence targets (§7.7)
# ==================================================================================================


def _selected(problem: AttentionSVMProblem, selected) -> list[np.ndarray]:
    if len(selected) != problem.n:
        raise ValueError(f"selected must hold one token set per input ({problem.n}), got {len(selected)}")
    out = []
    for O in selected:
        O = np.unique(np.asarray(O, dtype=np.int64))
        if O.size == 0 or O[0] < 0 or O[-1] >= problem.T:
            raise ValueError(f"selected: every set must be a non-empty subset of tokens 0..{problem.T - 1}")
        out.append(O)
    return out


def selection_rows(problem: AttentionSVMProblem, selected) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the selection constraints (§7.7): equalities A_j = Φ_it − Φ_{i,t₀} (t ∈ O_i, t₀ = min O_i, t ≠ t₀)
    and margins G_j = Φ_it − Φ_iτ (t ∈ O_i, τ ∉ O_i). Returns (A (k, P), G (m, P))."""
    phi = problem.features
    eq, ineq = [], []
    for i, O in enumerate(_selected(problem, selected)):
        eq.extend(phi[i, t] - phi[i, O[0]] for t in O[1:])
        ineq.extend(phi[i, t] - phi[i, tau] for t in O for tau in range(problem.T) if tau not in O)
    P = problem.P
    return np.array(eq).reshape(-1, P), np.array(ineq).reshape(-1, P)


@dataclass(frozen=True)
class SelectionSVM:
    """W^dir of §7.7: ``theta`` (None when infeasible) with θ = G^T λ + A^T μ, λ ≥ 0."""

    feasible: bool
    theta: np.ndarray | None
    lam: np.ndarray | None
    mu: np.ndarray | None
    equalities: np.ndarray
    margins_rows: np.ndarray


def selection_svm(problem: AttentionSVMProblem, selected) -> SelectionSVM:
    """W^dir = argmin ||θ|| s.t. <A_j, θ> = 0 and <G_j, θ> ≥ 1 (§7.7): θ = N y on an orthonormal basis N of the
    null space of A, and y the least-distance program min ||y|| s.t. (G N) y ≥ 1 (one NNLS, :func:`ldp`)."""
    A, G = selection_rows(problem, selected)
    if len(G) == 0:
        raise ValueError("selected: every token is selected in every input, there is no margin constraint")
    feasible, theta, lam, mu = equality_ldp(A, G)
    if not feasible:
        return SelectionSVM(False, None, None, None, A, G)
    return SelectionSVM(True, theta.reshape(problem.theta_shape()), lam, mu, A, G)


def selection_offset(problem: AttentionSVMProblem, log_s, selected) -> np.ndarray:
    """W^fin = argmin ||θ|| s.t. <Φ_iτ − Φ_it, θ> = log(s_iτ/s_it) for t, τ ∈ O_i (§7.7): the minimum-norm solution
    of the equalities against t = min O_i (the others follow by differences), from the log-softmax ``log_s``."""
    log_s = check.finite_array(log_s, "log_s", shape=(problem.n, problem.T))
    A, _ = selection_rows(problem, selected)
    b = np.concatenate([log_s[i, O[1:]] - log_s[i, O[0]] for i, O in enumerate(_selected(problem, selected))])
    if len(A) == 0:
        return np.zeros(problem.theta_shape())
    return np.linalg.lstsq(A, b, rcond=None)[0].reshape(problem.theta_shape())


def corr(A, B) -> float:
    """corr(A, B) = <A, B>_F/(||A||_F ||B||_F) (§1)."""
    return check.correlation(A, B)


# ==================================================================================================
# Loss and gradient in log scale (§2.3)
# ==================================================================================================


def logits(problem: AttentionSVMProblem, theta) -> np.ndarray:
    """l_it = <Φ_it, θ> (§2.1)."""
    theta = check.finite_array(theta, "theta", shape=problem.theta_shape())
    return problem.features @ theta.ravel()


def kernel_labels(problem: AttentionSVMProblem) -> np.ndarray:
    """A writable copy of the labels Y, as the kernels take them: the shared loss kernel
    (:func:`log_scaled_logit_gradient`) is also called by next_token_scc with a writable vector, and a read-only
    one would be a second signature to compile."""
    return np.array(problem.Y)


def loss_and_gradient(problem: AttentionSVMProblem, theta, *, log_scale: bool = False) -> dict:
    """Loss L(θ) = (1/n)Σ ℓ(Y_i f_i) and ∇_θ L (§2.3) at θ (p: (d,), W: (d, d)).

    Returns ``loss``, ``log_loss``, ``gradient`` (underflows to 0 far out), ``direction`` ∇L/||∇L|| (exact at any
    ||θ||), ``log_gradient_scale`` (log of the factor e^c), ``log_gradient_norm`` log||∇L|| (finite where the
    gradient underflows, :func:`log_gradient_norm`) and ``unsat`` = max_i(1 − max_t s_it). The linear loss can be
    negative: its ``log_loss`` is log L where L > 0 and None where log L is undefined."""
    l = logits(problem, theta)
    a = problem.X @ problem.v
    D, c, loss, log_loss, unsat = log_scaled_logit_gradient(l, a, kernel_labels(problem), LOSS_CODE[problem.loss])
    g = np.einsum("it,itp->p", D, problem.features).reshape(problem.theta_shape())
    norm = np.linalg.norm(g)
    with np.errstate(divide="ignore"):  # a zero gradient has log-norm −inf
        log_norm = float(c + np.log(norm)) if np.isfinite(c) else -np.inf
    if problem.loss == "linear":  # the kernel leaves log L to the caller: L = −mean(u) may be ≤ 0
        log_loss = float(np.log(loss)) if loss > 0 else None
    return dict(loss=float(loss), log_loss=None if log_loss is None else float(log_loss),
                gradient=g * np.exp(c) if np.isfinite(c) else g * 0.0, direction=g / norm if norm > 0 else g,
                log_gradient_scale=float(c), log_gradient_norm=log_norm, unsat=float(unsat))


def log_gradient_norm(problem: AttentionSVMProblem, theta) -> float:
    """log||∇_θ L(θ)|| (§2.3), finite far out where ∇L itself underflows to 0 (||θ|| of a few hundred on the
    instances here): with dL/dl = e^c D (:func:`log_scaled_logit_gradient`, D of order one) it is
    c + log||Σ_it D_it Φ_it||. −inf at an exactly zero gradient."""
    return loss_and_gradient(problem, theta)["log_gradient_norm"]
