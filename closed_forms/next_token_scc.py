"""Next-token prediction with one self-attention layer: token-priority graphs, their SCCs, the Graph-SVM and the
finite part W^fin.

Li, Huang, Ildiz, Rawat & Oymak, *Mechanics of Next Token Prediction with Self-Attention* (AISTATS 2024). The
derivations are in docs/next_token_scc.md; section numbers below (§k) refer to that page.

The last token of sequence i attends over the whole sequence with logits ``l_it = x_it^T W x̄_i``; the identity head
reads off the attention mass on the label, and the log-loss is L(W) = −(1/n) Σ_i log Σ_{t: x_it = y_i} s_it (§2).
Every logit is an entry of Z = E W E^T: ``l_it = Z[x_it, k_i]`` with k_i the last token.

The Frobenius least-distance solver, the nuclear-norm solver and the cancellation-free gradient are shared with
attention_svm (:mod:`attnflow.closed_forms.max_margin`, :func:`attnflow.closed_forms.attention_svm.log_scaled_logit_gradient`).
No randomness beyond the seeded instance constructors, no I/O, no plotting.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize
from scipy.sparse import csgraph

from attnflow import seeding
from attnflow.closed_forms import checks as check
from attnflow.closed_forms.logit_losses import LOG_LOSS_CODE, log_scaled_logit_gradient
from attnflow.closed_forms.certificates import UncertifiedSolution
from attnflow.closed_forms.max_margin import equality_ldp, nuclear_program
from attnflow.closed_forms.parameters import Parameter, parse_parameters

__all__ = ["NTPProblem", "INSTANCES", "REQUIREMENTS", "PriorityGraphs", "priority_graphs", "high_priority_mask",
           "GraphSVM", "graph_svm", "certified_graph_svm", "UncertifiedSolution", "NUC_GAP",
           "DECISION_NUC_ITERATIONS", "sfin_basis", "project_sfin", "reduced_loss_and_gradient", "w_fin",
           "loss_and_gradient", "log_gradient_norm", "logits", "attention", "predicted_attention", "corr",
           "fit_radius", "svm_logits", "MAX_N", "MAX_T", "MAX_K", "MAX_D"]

INSTANCES = ("paper", "mixed", "random", "cyclic_toy")
REQUIREMENTS = ("cyclic", "acyclic", "any")
MAX_N, MAX_T, MAX_K, MAX_D = 400, 32, 64, 64
MAX_TRIES = 10_000
# Relative tolerance of the Gram rank test on the embeddings (rows must be linearly independent, §1).
RANK_TOL = 1e-9
# The nuclear Graph-SVM is certified when PDHG's relative duality gap reaches NUC_GAP. graph_svm stops at
# max_iterations whatever the gap (the solution says whether it is certified); a caller that reads a decision off it
# (a rank, the active edges) uses certified_graph_svm, which iterates up to DECISION_NUC_ITERATIONS and otherwise
# refuses.
NUC_GAP = 1e-8
DECISION_NUC_ITERATIONS = 1_000_000
MAX_NUC_ITERATIONS = 100_000_000


@dataclass(frozen=True)
class NTPProblem:
    """A next-token data set (§1): ``ids`` (n, T) token indices x_it ∈ [K], ``labels`` (n,) y_i ∈ [K], and the
    embeddings ``E`` (K, d) with linearly independent rows. Every label occurs in its sequence (realisable labels)."""

    ids: np.ndarray
    labels: np.ndarray
    E: np.ndarray
    name: str = field(default="custom", compare=False)

    PARAMETERS = (
        Parameter("instance", "choice", "paper", "paper (n6 T4 K6 d8), mixed (n10 T5 K10 d12, one last token), "
                  "random (sizes below) or the fully cyclic toy", choices=INSTANCES),
        Parameter("n", "integer", 6, "sequences (random instance)", minimum=1, maximum=MAX_N),
        Parameter("T", "integer", 4, "tokens per sequence, T ≤ K (random instance)", minimum=1, maximum=MAX_T),
        Parameter("K", "integer", 6, "vocabulary size, K ≤ d (random instance)", minimum=1, maximum=MAX_K),
        Parameter("d", "integer", 8, "embedding dimension (random instance)", minimum=1, maximum=MAX_D),
        Parameter("same_last", "boolean", False, "every sequence ends with token 0 (random instance)"),
        Parameter("require", "choice", "cyclic", "redraw until some graph has a cycle, none has, or accept any",
                  choices=REQUIREMENTS),
        Parameter("instance_seed", "integer", 0, "seed of the random instance", minimum=0, maximum=2**63 - 1),
    )

    def __post_init__(self):
        ids = np.asarray(self.ids)
        if ids.ndim != 2 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids must be a non-empty (n, T) integer array, got shape {ids.shape} and dtype {ids.dtype}")
        n, T = ids.shape
        E = check.finite_array(self.E, "E", ndim=2)
        K, d = E.shape
        if not (n <= MAX_N and T <= MAX_T and K <= MAX_K and d <= MAX_D):
            raise ValueError(f"sizes must be n ≤ {MAX_N}, T ≤ {MAX_T}, K ≤ {MAX_K}, d ≤ {MAX_D}; got {n}, {T}, {K}, {d}")
        if ids.min() < 0 or ids.max() >= K:
            raise ValueError(f"ids must hold token indices 0..{K - 1}, got values in [{ids.min()}, {ids.max()}]")
        labels = np.asarray(self.labels)
        if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"labels must be {n} integer token indices, got shape {labels.shape}")
        if labels.min() < 0 or labels.max() >= K:
            raise ValueError(f"labels must be token indices 0..{K - 1}")
        missing = [i for i in range(n) if labels[i] not in ids[i]]
        if missing:
            raise ValueError(f"labels: y_i must occur in sequence i (realisable labels), violated for i = {missing[:5]}")
        gram = np.linalg.svd(E, compute_uv=False)
        if K > d or gram.min() <= RANK_TOL * gram.max():
            raise ValueError(f"E: the K = {K} embeddings must be linearly independent in d = {d} (§1)")
        for name, value in (("ids", ids), ("labels", labels), ("E", E)):
            value = np.ascontiguousarray(value, dtype=np.float64 if name == "E" else np.int64)
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    # ---- sizes ---------------------------------------------------------------------------------------------

    @property
    def n(self) -> int:
        return self.ids.shape[0]

    @property
    def T(self) -> int:
        return self.ids.shape[1]

    @property
    def K(self) -> int:
        return self.E.shape[0]

    @property
    def d(self) -> int:
        return self.E.shape[1]

    @property
    def last(self) -> np.ndarray:
        """k_i, the last token of each sequence (the query)."""
        return self.ids[:, -1]

    @functools.cached_property
    def label_mask(self) -> np.ndarray:
        """(n, T) float: 1 where x_it = y_i (the identity head's value of position t, §2)."""
        mask = (self.ids == self.labels[:, None]).astype(np.float64)
        mask.setflags(write=False)
        return mask

    # ---- constructors --------------------------------------------------------------------------------------

    @classmethod
    def from_params(cls, values) -> "NTPProblem":
        p = parse_parameters(cls.PARAMETERS, values, owner="next_token_scc")
        if p["instance"] == "cyclic_toy":
            return cls.cyclic_toy(seed=p["instance_seed"])
        if p["instance"] == "paper":
            return cls.paper(seed=p["instance_seed"], require=p["require"])
        if p["instance"] == "mixed":
            return cls.mixed(seed=p["instance_seed"], require=p["require"])
        return cls.random(p["n"], p["T"], p["K"], p["d"], seed=p["instance_seed"], require=p["require"],
                          same_last=p["same_last"])

    @classmethod
    def random(cls, n: int, T: int, K: int, d: int, *, seed: seeding.SeedLike, require: str = "cyclic",
               same_last: bool = False) -> "NTPProblem":
        """The generator of §1.1: T distinct tokens per sequence, uniform label replaced by a uniform token of the
        sequence when absent, random unit embeddings; redrawn until ``require`` holds (§1.2)."""
        n = check.integer(n, "n", minimum=1)
        T = check.integer(T, "T", minimum=1)
        K = check.integer(K, "K", minimum=1)
        d = check.integer(d, "d", minimum=1)
        if T > K:
            raise ValueError(f"T must be at most K (distinct tokens per sequence), got T = {T}, K = {K}")
        if K > d:
            raise ValueError(f"K must be at most d (independent embeddings), got K = {K}, d = {d}")
        if n > MAX_N or T > MAX_T or K > MAX_K or d > MAX_D:
            raise ValueError(f"sizes must be n ≤ {MAX_N}, T ≤ {MAX_T}, K ≤ {MAX_K}, d ≤ {MAX_D}")
        if require not in REQUIREMENTS:
            raise ValueError(f"require must be one of {REQUIREMENTS}, got {require!r}")
        if require == "cyclic" and T < 2:  # a sequence of one token has no edge: no draw could be cyclic
            raise ValueError("require: a cyclic instance needs T >= 2 tokens per sequence, got T = 1")
        rng = np.random.default_rng(seeding.as_seed_sequence(seed))
        for _ in range(MAX_TRIES):
            ids = np.array([rng.permutation(K)[:T] for _ in range(n)], dtype=np.int64)
            if same_last:
                for row in ids:
                    zero = np.flatnonzero(row == 0)
                    if zero.size:
                        row[zero[0]], row[-1] = row[-1], row[zero[0]]
                    else:
                        row[-1] = 0
            labels = rng.integers(0, K, size=n)
            for i in range(n):
                if labels[i] not in ids[i]:
                    labels[i] = ids[i, rng.integers(0, T)]
            E = rng.normal(size=(K, d))
            E /= np.linalg.norm(E, axis=1, keepdims=True)
            problem = cls(ids, labels, E, name=f"random n={n} T={T} K={K} d={d}" + (" same_last" if same_last else ""))
            cyclic = priority_graphs(problem).cyclic
            if require == "any" or cyclic == (require == "cyclic"):
                return problem
        raise ValueError(f"require: no {require} instance in {MAX_TRIES} draws at n={n}, T={T}, K={K}")

    @classmethod
    def paper(cls, *, seed: seeding.SeedLike, require: str = "cyclic") -> "NTPProblem":
        """The global-convergence experiment's size n = 6, T = 4, K = 6, d = 8 (§7)."""
        return cls.random(6, 4, 6, 8, seed=seed, require=require)

    @classmethod
    def mixed(cls, *, seed: seeding.SeedLike, require: str = "cyclic") -> "NTPProblem":
        """n = 10, T = 5, K = 10, d = 12 with every sequence ending in token 0: one graph carries every edge, so
        cycles and strict edges mix and W^fin ≠ 0 in most draws (§7)."""
        return cls.random(10, 5, 10, 12, seed=seed, require=require, same_last=True)

    @classmethod
    def cyclic_toy(cls, *, seed: seeding.SeedLike, d: int = 8) -> "NTPProblem":
        """The fully cyclic toy (§6.2): K = 3, six copies of [0, 1, 2] labelled (0, 1, 1, 2, 2, 2) and six of
        [2, 1, 0] labelled (2, 1, 1, 0, 0, 0); random unit embeddings in d dimensions."""
        rng = np.random.default_rng(seeding.as_seed_sequence(seed))
        E = rng.normal(size=(3, check.integer(d, "d", minimum=3)))
        E /= np.linalg.norm(E, axis=1, keepdims=True)
        ids = np.array([[0, 1, 2]] * 6 + [[2, 1, 0]] * 6, dtype=np.int64)
        labels = np.array([0, 1, 1, 2, 2, 2, 2, 1, 1, 0, 0, 0], dtype=np.int64)
        return cls(ids, labels, E, name="cyclic_toy")

    def with_labels(self, labels) -> "NTPProblem":
        return NTPProblem(self.ids, np.asarray(labels, dtype=np.int64), self.E, name=self.name)


# ==================================================================================================
# Token-priority graphs and SCCs (§3)
# ==================================================================================================


@dataclass(frozen=True)
class PriorityGraphs:
    """The graphs G^(k), one per last token k (§3): ``adjacency`` (K, K, K) bool with adjacency[k, a, b] for the
    edge a → b of G^(k); ``components`` (K, K) int, the SCC label of token a in G^(k) (labels are per graph)."""

    adjacency: np.ndarray
    components: np.ndarray

    @property
    def cyclic(self) -> bool:
        """Some graph has an SCC of two or more tokens."""
        return any(np.bincount(c).max() >= 2 for c in self.components)

    def same_component(self, k: int, a, b) -> np.ndarray:
        """a ≍_k b: the tokens are in one SCC of G^(k)."""
        return self.components[k, a] == self.components[k, b]

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(k, a, b) of every edge, split into equalities (a ≍_k b) and strict priorities (a ⇒_k b)."""
        k, a, b = np.nonzero(self.adjacency)
        same = self.components[k, a] == self.components[k, b]
        return np.stack([k[same], a[same], b[same]], 1), np.stack([k[~same], a[~same], b[~same]], 1)


def priority_graphs(problem: NTPProblem, sources=None, excluded=None) -> PriorityGraphs:
    """G^(k) (§3): for each sequence i ending in k, an edge from every source token c of i (default: the label y_i)
    to every other token of X_i that is not ``excluded``; SCCs by scipy's strong components.

    ``sources`` / ``excluded``: optional per-sequence token sets, for the local graphs of §5.3."""
    n, K = problem.n, problem.K
    if sources is None:
        sources = [[int(y)] for y in problem.labels]
    if excluded is None:
        excluded = [[] for _ in range(n)]
    if len(sources) != n or len(excluded) != n:
        raise ValueError(f"sources and excluded must hold one token set per sequence ({n})")
    adjacency = np.zeros((K, K, K), dtype=bool)
    for i in range(n):
        k = problem.last[i]
        present = set(problem.ids[i].tolist())
        targets = present - set(int(e) for e in excluded[i])
        for c in sources[i]:
            c = int(c)
            if c not in present:
                raise ValueError(f"sources: token {c} does not occur in sequence {i}")
            for j in targets - {c}:
                adjacency[k, c, j] = True
    components = np.empty((K, K), dtype=np.int64)
    for k in range(K):
        _, components[k] = csgraph.connected_components(adjacency[k].astype(np.int8), directed=True,
                                                        connection="strong")
    adjacency.setflags(write=False)
    components.setflags(write=False)
    return PriorityGraphs(adjacency, components)


def high_priority_mask(problem: NTPProblem, graphs: PriorityGraphs | None = None) -> np.ndarray:
    """O_i as an (n, T) bool mask: positions whose token is in the label's SCC of G^(k_i) (§3)."""
    graphs = priority_graphs(problem) if graphs is None else graphs
    comp = graphs.components[problem.last]                      # (n, K)
    rows = np.arange(problem.n)
    label_comp = comp[rows, problem.labels]
    return comp[rows[:, None], problem.ids] == label_comp[:, None]


# ==================================================================================================
# The Graph-SVM (§4.1)
# ==================================================================================================


def _row(problem: NTPProblem, k: int, a: int, b: int) -> np.ndarray:
    """vec((e_a − e_b) e_k^T), row-major: <row, vec W> = (e_a − e_b)^T W e_k."""
    return np.kron(problem.E[a] - problem.E[b], problem.E[k])


@dataclass(frozen=True)
class GraphSVM:
    """The Graph-SVM (§4.1): ``W`` (d, d) with ``equalities`` and ``strict`` index arrays (k, a, b), the rows
    A (equalities) and G (strict), the multipliers λ ≥ 0 (strict) and μ (equalities) with W = G^T λ + A^T μ
    (Frobenius), the strict margins, and the norm (``fro`` or ``nuc``). The nuclear solution's certificate travels
    with it: ``gap`` the relative duality gap reached after ``iterations`` PDHG iterations, ``requested_gap`` the
    level that certifies it (``certified``)."""

    W: np.ndarray
    equalities: np.ndarray
    strict: np.ndarray
    A: np.ndarray
    G: np.ndarray
    lam: np.ndarray
    mu: np.ndarray
    margins: np.ndarray
    norm: str
    gap: float = 0.0
    iterations: int = 0
    requested_gap: float = 0.0

    @property
    def certified(self) -> bool:
        """The Frobenius solution always (one NNLS, exact to round-off), the nuclear one when its duality gap reached
        ``requested_gap``."""
        return self.norm == "fro" or self.gap <= self.requested_gap

    @property
    def accuracy(self) -> float:
        """The scale of the solver's error, relative to the largest singular value: 0 for the Frobenius solution
        (exact to round-off), gap·||W||_*/σ_max for the nuclear one (gap·||W||_* bounds how far ||W||_* lies above
        the optimum). A singular value below it cannot be told from the solver's error: the projection onto
        {A W = 0} leaves values of 1e-12 to 1e-10 σ_max where the paper instances' optimum has zeros."""
        s = np.linalg.svd(self.W, compute_uv=False)
        return float(self.gap * s.sum() / s[0]) if self.norm == "nuc" and s[0] > 0 else 0.0

    @property
    def value(self) -> float:
        if self.norm == "nuc":
            return float(np.linalg.svd(self.W, compute_uv=False).sum())
        return float(np.linalg.norm(self.W))


def graph_svm(problem: NTPProblem, norm: str = "fro", *, graphs: PriorityGraphs | None = None,
              gap: float = NUC_GAP, max_iterations: int = 100_000) -> GraphSVM:
    """W^svm = argmin ||W|| s.t. (e_a − e_b)^T W e_k = 0 on edges inside an SCC of G^(k) and ≥ 1 on the strict
    edges (§4.1), Frobenius (exact, one NNLS on the null space of the equalities) or nuclear (PDHG with a
    certificate, §4.3). With no strict edge W^svm = 0. Always feasible for independent embeddings (§4.1).

    PDHG stops at the relative duality gap ``gap``, or after ``max_iterations`` (one paper-size instance in a
    50-seed calibration needed 20 000–100 000 iterations, 1 s) with the gap it reached: the solution's ``certified``
    says which. :func:`certified_graph_svm` is the entry point for a caller that reads a decision off it."""
    if norm not in ("fro", "nuc"):
        raise ValueError(f"norm must be fro or nuc, got {norm!r}")
    gap = check.real(gap, "gap", minimum=0.0, strict=True, maximum=1.0)
    max_iterations = check.integer(max_iterations, "max_iterations", minimum=25)
    if max_iterations > MAX_NUC_ITERATIONS:
        raise ValueError(f"max_iterations must be <= {MAX_NUC_ITERATIONS:.0e} (hours of PDHG), got {max_iterations}")
    graphs = priority_graphs(problem) if graphs is None else graphs
    eq, strict = graphs.edges()
    P = problem.d * problem.d
    A = np.array([_row(problem, *e) for e in eq]).reshape(-1, P)
    G = np.array([_row(problem, *e) for e in strict]).reshape(-1, P)
    if len(G) == 0:
        zero = np.zeros((problem.d, problem.d))
        return GraphSVM(zero, eq, strict, A, G, np.zeros(0), np.zeros(len(A)), np.zeros(0), norm)
    feasible, theta, lam, mu = equality_ldp(A, G)
    if not feasible:
        raise ValueError("E: the Graph-SVM is infeasible (the embeddings are numerically dependent)")
    if norm == "fro":
        return GraphSVM(theta.reshape(problem.d, problem.d), eq, strict, A, G, lam, mu, G @ theta, "fro")
    out = nuclear_program(G, (problem.d, problem.d), theta, lam, A=A, start_mu=mu, gap=gap,
                          max_iterations=max_iterations)
    if out is None:
        raise ValueError("the nuclear Graph-SVM found no feasible iterate")
    return GraphSVM(out["theta"], eq, strict, A, G, out["lam"], out["mu"], out["margins"], "nuc", out["gap"],
                    iterations=out["iterations"], requested_gap=gap)


def certified_graph_svm(problem: NTPProblem, norm: str = "fro", *, graphs: PriorityGraphs | None = None,
                        gap: float = NUC_GAP, max_iterations: int = DECISION_NUC_ITERATIONS) -> GraphSVM:
    """:func:`graph_svm` for a caller that reads a decision off the solution (its rank, its active edges): a nuclear
    solution whose duality gap is still above ``gap`` after ``max_iterations`` raises :class:`UncertifiedSolution`
    with the gap it reached."""
    sol = graph_svm(problem, norm, graphs=graphs, gap=gap, max_iterations=max_iterations)
    if not sol.certified:
        raise UncertifiedSolution(
            f"the nuclear Graph-SVM stopped at relative duality gap {sol.gap:.2g} after {sol.iterations} iterations, "
            f"above the gap={sol.requested_gap:g} that certifies it; pass max_iterations > {sol.iterations} (or a "
            "larger gap) to decide", sol.gap)
    return sol


def svm_logits(problem: NTPProblem, W) -> np.ndarray:
    """Z = E W E^T (K, K): Z[a, k] = e_a^T W e_k, the logit of token a under the query k (§2.1)."""
    W = check.finite_array(W, "W", shape=(problem.d, problem.d))
    return problem.E @ W @ problem.E.T


# ==================================================================================================
# The finite part (§4.2)
# ==================================================================================================


def sfin_basis(problem: NTPProblem, graphs: PriorityGraphs | None = None) -> np.ndarray:
    """Orthonormal basis (d², r) of S_fin = span{(e_a − e_b) e_k^T : a ≍_k b, a ≠ b} (§4.2), row-major vec."""
    graphs = priority_graphs(problem) if graphs is None else graphs
    rows = []
    for k in np.unique(problem.last):
        comp = graphs.components[k]
        for label in np.unique(comp):
            members = np.flatnonzero(comp == label)
            rows += [_row(problem, k, a, members[0]) for a in members[1:]]
    P = problem.d * problem.d
    if not rows:
        return np.zeros((P, 0))
    _, sv, Vt = np.linalg.svd(np.array(rows), full_matrices=False)
    return Vt[: int(np.sum(sv > 1e-12 * sv.max()))].T


def project_sfin(W, basis: np.ndarray) -> np.ndarray:
    """Π_{S_fin} W (orthogonal projection on the basis of :func:`sfin_basis`); W (..., d, d)."""
    basis = check.finite_array(basis, "basis", ndim=2)
    W = check.finite_array(W, "W")
    d = W.shape[-1] if W.ndim >= 2 else 0
    if W.ndim < 2 or W.shape[-2] != d or d * d != basis.shape[0]:
        raise ValueError(f"W must have shape (..., d, d) with d² = {basis.shape[0]} rows of basis, got {W.shape}")
    flat = W.reshape(-1, d * d)
    return ((flat @ basis) @ basis.T).reshape(W.shape)


def logits(problem: NTPProblem, W) -> np.ndarray:
    """l_it = x_it^T W x̄_i = Z[x_it, k_i] (n, T) (§2)."""
    Z = svm_logits(problem, W)
    return Z[problem.ids, problem.last[:, None]]


def loss_and_gradient(problem: NTPProblem, W, *, mask=None) -> dict:
    """L(W) = −(1/n) Σ_i log Σ_{t: x_it = y_i} s_it and ∇_W L = E^T G_Z E (§2.2), cancellation-free (the shared
    log-scaled kernel with the log-loss). ``mask`` (n, T) bool restricts every softmax to its True positions: the
    reduced loss of §4.2 with mask = O_i.

    Returns ``loss``, ``log_loss``, ``gradient`` (underflows to 0 once the loss is below ~1e-308; its logarithm
    is :func:`log_gradient_norm`) and ``logit_gradient`` (n, T) dL/dl_it."""
    D, c, loss, log_loss = _log_scaled_gradient(problem, W, mask)
    D = D * np.exp(c) if np.isfinite(c) else np.zeros_like(D)
    return dict(loss=float(loss), log_loss=float(log_loss), gradient=_gradient_from_logits(problem, D),
                logit_gradient=D)


def log_gradient_norm(problem: NTPProblem, W, *, mask=None) -> float:
    """log||∇_W L(W)||_F (§2.2), finite where the gradient itself underflows to 0 (‖W‖ of a few hundred along
    W^svm): with dL/dl = e^c D from the shared log-scaled kernel (D of order one) it is c + log||E^T G_Z(D) E||_F.
    −inf at an exactly zero gradient; ``mask`` as in :func:`loss_and_gradient`."""
    D, c, _, _ = _log_scaled_gradient(problem, W, mask)
    if not np.isfinite(c):
        return -np.inf
    with np.errstate(divide="ignore"):  # a zero gradient has log-norm −inf
        return float(c + np.log(np.linalg.norm(_gradient_from_logits(problem, D))))


def _log_scaled_gradient(problem: NTPProblem, W, mask):
    """(D, c, L, log L) of the shared kernel at W, dL/dl = e^c D, with the boundary checks of W and ``mask``."""
    W = check.finite_array(W, "W")
    if np.abs(W).max(initial=0.0) > 1e100:  # logits of size 1e300 leave no finite softmax
        raise ValueError(f"W has entries of size {np.abs(W).max():.3g}; at most 1e100 keeps the logits finite")
    l = logits(problem, W)
    if mask is not None:
        mask = np.asarray(mask, bool)
        if mask.shape != l.shape or not np.all(mask[problem.label_mask > 0]):
            raise ValueError("mask must be an (n, T) bool array that keeps every label position")
        l = np.where(mask, l, -np.inf)
    # a writable copy of the mask: the compiled kernel's signature is then the one dynamics.next_token_scc uses
    D, c, loss, log_loss, _ = log_scaled_logit_gradient(l, np.array(problem.label_mask), np.ones(problem.n),
                                                        LOG_LOSS_CODE)
    return D, c, loss, log_loss


def _gradient_from_logits(problem: NTPProblem, D) -> np.ndarray:
    """∇_W L = E^T G_Z E with G_Z[a, k] the sum of dL/dl_it over positions holding token a under query k (§2.2)."""
    GZ = np.zeros((problem.K, problem.K))
    np.add.at(GZ, (problem.ids, np.broadcast_to(problem.last[:, None], problem.ids.shape)), D)
    return problem.E.T @ GZ @ problem.E


def reduced_loss_and_gradient(problem: NTPProblem, W, O=None) -> tuple[float, np.ndarray]:
    """L_red(W) = −(1/n) Σ_i log(Σ_{t∈O_i, x_it=y_i} e^{l_it}/Σ_{t∈O_i} e^{l_it}) and its gradient (§4.2)."""
    O = high_priority_mask(problem) if O is None else O
    out = loss_and_gradient(problem, W, mask=O)
    return out["loss"], out["gradient"]


def w_fin(problem: NTPProblem, *, graphs: PriorityGraphs | None = None, gtol: float = 1e-11) -> np.ndarray:
    """W^fin = argmin_{W ∈ S_fin} L_red(W) (§4.2): strictly convex and coercive on S_fin, minimised by BFGS on the
    coordinates of an orthonormal basis, then Newton-polished with a finite-difference Hessian of the gradient.
    0 when S_fin = {0}."""
    graphs = priority_graphs(problem) if graphs is None else graphs
    basis = sfin_basis(problem, graphs)
    d = problem.d
    if basis.shape[1] == 0:
        return np.zeros((d, d))
    O = high_priority_mask(problem, graphs)

    def fun(x):
        loss, grad = reduced_loss_and_gradient(problem, (basis @ x).reshape(d, d), O)
        return loss, basis.T @ grad.ravel()

    result = optimize.minimize(fun, np.zeros(basis.shape[1]), jac=True, method="BFGS",
                               options=dict(gtol=gtol, maxiter=10_000))
    x = result.x
    for _ in range(3):  # Newton steps: the Hessian by central differences of the exact gradient
        g = fun(x)[1]
        if np.linalg.norm(g) < 1e-14:
            break
        h = 1e-6
        H = np.array([(fun(x + h * e)[1] - fun(x - h * e)[1]) / (2 * h) for e in np.eye(len(x))])
        x = x - np.linalg.solve((H + H.T) / 2, g)
    return (basis @ x).reshape(d, d)


# ==================================================================================================
# Attention (§5)
# ==================================================================================================


def attention(problem: NTPProblem, W) -> np.ndarray:
    """s_i = softmax(l_i) (n, T)."""
    l = logits(problem, W)
    return np.exp(l - np.logaddexp.reduce(l, axis=1, keepdims=True))


def predicted_attention(problem: NTPProblem, W_fin=None, graphs: PriorityGraphs | None = None) -> np.ndarray:
    """The limit attention on the training sequences (§5.1): 0 outside O_i, softmax(l^fin_i) on O_i, with
    l^fin_it = x_it^T W^fin x̄_i."""
    graphs = priority_graphs(problem) if graphs is None else graphs
    W_fin = w_fin(problem, graphs=graphs) if W_fin is None else W_fin
    O = high_priority_mask(problem, graphs)
    l = np.where(O, logits(problem, W_fin), -np.inf)
    return np.exp(l - np.logaddexp.reduce(l, axis=1, keepdims=True))


def corr(A, B) -> float:
    """corr(A, B) = <A, B>_F/(||A||_F ||B||_F)."""
    return check.correlation(A, B)


def fit_radius(W, W_fin, W_svm) -> float:
    """R = argmin_R ||W − W^fin − R W^svm||_F, the least-squares radius of the decomposition W ≈ W^fin + R W^svm
    (§5.1)."""
    W_svm = check.finite_array(W_svm, "W_svm")
    W, W_fin = check.finite_array(W, "W", shape=W_svm.shape), check.finite_array(W_fin, "W_fin", shape=W_svm.shape)
    if not np.any(W_svm):
        raise ValueError("W_svm is zero: the radius along it is undefined")
    return float(np.sum((W - W_fin) * W_svm) / np.sum(W_svm ** 2))
