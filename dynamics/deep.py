"""The deep tier: a GPT-style decoder in JAX, trained with Adam on prompts from attnflow's own samplers.

Optional: this module imports ``jax`` and ``optax`` (``pip install -e '.[deep]'``); nothing in the core imports it.
The models, the settings and which paper table each experiment reproduces are documented in docs/deep.md.

* :class:`GPTConfig` and :func:`init_gpt` / :func:`gpt_forward`: a decoder of ``layers`` blocks with ``heads``
  heads, pre-LayerNorm or none, softmax or linear attention, an optional GELU MLP, a linear read-in of the tokens and
  learned positions (``embed=True``), the prediction read out at the last token (docs/deep.md §1). With
  ``embed=False, layer_norm=False, attention="linear", mask="context"`` one block is exactly the linear
  self-attention (3.4) of docs/gd_beta.md §2.2 on the token matrix (3.1): the bridge to the core's closed forms.
* :func:`one_nn_predict` (the one-layer softmax model of docs/one_nn.md §2) and :func:`scb_predict` (model (2) of
  docs/scb.md §3 with its linear attention column or a softmax over the positions in its place, docs/deep.md §3),
  with :func:`scb_train` (the paper's preconditioned online GD for either), :func:`scb_population_path` (its
  population map from the closed forms) and :func:`scb_samples` (the data model (1) in numpy).
* :func:`train`: Adam (optax) with a cosine decay of the learning rate to 1% of its start, as
  :mod:`attnflow.dynamics.optimizers`; a fresh batch every step, drawn in numpy by the caller's sampler from the
  claim's seed; ``chunk`` steps run inside one compiled ``lax.scan``.

Every random number flows from a SeedSequence: :func:`jax_key` turns one into a JAX key (its first two 32-bit words),
and the data come from numpy Generators of the same SeedSequence. On a CPU, XLA runs on one thread here (set before
JAX is imported, unless ``XLA_FLAGS`` is already set), so that two runs of one seed give the same bits.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from typing import Callable

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from attnflow.closed_forms import checks as check  # noqa: E402
from attnflow.seeding import SeedLike, as_seed_sequence  # noqa: E402

from .errors import DivergenceError  # noqa: E402

__all__ = ["GPTConfig", "ATTENTIONS", "MASKS", "jax_key", "init_gpt", "gpt_forward", "gpt_predict", "parameter_count",
           "flops_per_step", "OPTIMIZERS", "one_nn_predict", "one_nn_attention", "scb_softmax_predict", "scb_predict", "scb_loss",
           "scb_preconditioned_gradients", "scb_train", "scb_samples", "scb_population_path", "softmax_columns", "train",
           "TrainResult"]

ATTENTIONS = ("softmax", "linear")
MASKS = ("causal", "context")


@dataclass(frozen=True)
class GPTConfig:
    """The decoder's shape (docs/deep.md §1).

    layers, heads, width : blocks, heads per block, residual width (a multiple of ``heads``).
    mlp : a GELU MLP of 4·width after each attention (GPT-2's block); False keeps attention alone.
    attention : ``softmax`` (scores/√d_head) or ``linear`` (scores/N, N the number of context tokens).
    layer_norm : pre-LayerNorm before each sub-block and after the last (GPT-2); False: none.
    mask : ``causal`` (a token sees itself and the tokens before it: GPT-2) or ``context`` (every token sees the N
        context tokens and not the query, the mask M of (3.2)).
    embed : a linear read-in of the tokens to ``width`` plus learned positions, and a linear read-out; False: the
        tokens, padded with zeros to ``width`` (at least the token size), are the residual stream, and the
        prediction is the query's label slot (the token's last coordinate), as in (3.3) and (3.4).
    """

    layers: int = 2
    heads: int = 2
    width: int = 32
    mlp: bool = True
    attention: str = "softmax"
    layer_norm: bool = True
    mask: str = "causal"
    embed: bool = True

    def __post_init__(self):
        check.integer(self.layers, "layers", minimum=1)
        check.integer(self.heads, "heads", minimum=1)
        check.integer(self.width, "width", minimum=1)
        if self.width % self.heads:
            raise ValueError(f"width must be a multiple of heads, got width={self.width}, heads={self.heads}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.mask not in MASKS:
            raise ValueError(f"mask must be one of {MASKS}, got {self.mask!r}")

    @property
    def residual_branches(self) -> int:
        """GPT-2 scales its residual output projections by 1/√(number of residual branches)."""
        return self.layers * (2 if self.mlp else 1)


def jax_key(seed: SeedLike) -> jax.Array:
    """A JAX PRNG key from a seed: the first two 32-bit words its SeedSequence generates."""
    words = as_seed_sequence(seed).generate_state(2, np.uint32)
    return jax.random.wrap_key_data(jnp.asarray(words), impl="threefry2x32")


# ------------------------------------------------------------------------------------------------------------
# The decoder
# ------------------------------------------------------------------------------------------------------------

def init_gpt(key: jax.Array, config: GPTConfig, token_size: int, n_tokens: int, *, scale: float = 0.02) -> dict:
    """GPT-2's initialisation: weights N(0, scale²), residual output projections N(0, scale²/n_res), LayerNorm
    gains 1, biases 0 (docs/deep.md §1)."""
    width = config.width
    if not config.embed and width < token_size:
        raise ValueError(f"without embed the width must hold a token: width={width} < token size {token_size}")
    out_scale = scale / math.sqrt(config.residual_branches)
    keys = iter(jax.random.split(key, 4 + 6 * config.layers))

    def normal(shape, std):
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    params: dict = {}
    if config.embed:
        params["read_in"] = dict(w=normal((token_size, width), scale), b=jnp.zeros(width))
        params["positions"] = normal((n_tokens, width), scale)
        params["read_out"] = dict(w=normal((width, 1), scale), b=jnp.zeros(1))
    blocks = []
    for _ in range(config.layers):
        block = dict(wq=normal((width, width), scale), wk=normal((width, width), scale),
                     wv=normal((width, width), scale), wo=normal((width, width), out_scale))
        if config.layer_norm:
            block["ln1"] = dict(g=jnp.ones(width), b=jnp.zeros(width))
        if config.mlp:
            block["w1"], block["b1"] = normal((width, 4 * width), scale), jnp.zeros(4 * width)
            block["w2"], block["b2"] = normal((4 * width, width), out_scale), jnp.zeros(width)
            if config.layer_norm:
                block["ln2"] = dict(g=jnp.ones(width), b=jnp.zeros(width))
        blocks.append(block)
    params["blocks"] = blocks
    if config.layer_norm:
        params["ln_f"] = dict(g=jnp.ones(width), b=jnp.zeros(width))
    return params


def _layer_norm(x, ln):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * ln["g"] + ln["b"]


def _allowed(config: GPTConfig, n_tokens: int) -> jax.Array:
    """allowed[i, j]: token i may attend to token j."""
    i = jnp.arange(n_tokens)[:, None]
    j = jnp.arange(n_tokens)[None, :]
    if config.mask == "causal":
        return j <= i
    return jnp.broadcast_to(j < n_tokens - 1, (n_tokens, n_tokens))


def _attention(x, block, config: GPTConfig, allowed):
    """Multi-head attention on one prompt x (n_tokens, width); returns the output and the heads' weights."""
    n, width = x.shape
    h = config.heads
    dh = width // h
    q = (x @ block["wq"].T).reshape(n, h, dh).transpose(1, 0, 2)
    k = (x @ block["wk"].T).reshape(n, h, dh).transpose(1, 0, 2)
    v = (x @ block["wv"].T).reshape(n, h, dh).transpose(1, 0, 2)
    scores = q @ k.transpose(0, 2, 1)
    if config.attention == "softmax":
        scores = jnp.where(allowed, scores / math.sqrt(dh), -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1)
    else:  # linear attention (3.4): raw scores over the allowed keys, normalised by the context length
        weights = jnp.where(allowed, scores, 0.0) / (n - 1)
    out = (weights @ v).transpose(1, 0, 2).reshape(n, width)
    return out @ block["wo"].T, weights


def gpt_forward(params: dict, tokens: jax.Array, config: GPTConfig):
    """The prediction at the last token of one prompt (tokens: n_tokens × token_size) and the attention weights of
    every block, shape (layers, heads, n_tokens, n_tokens)."""
    n, token_size = tokens.shape
    allowed = _allowed(config, n)
    if config.embed:
        x = tokens @ params["read_in"]["w"] + params["read_in"]["b"] + params["positions"][:n]
    else:
        x = jnp.pad(tokens, ((0, 0), (0, config.width - token_size)))
    maps = []
    for block in params["blocks"]:
        inner = _layer_norm(x, block["ln1"]) if config.layer_norm else x
        out, weights = _attention(inner, block, config, allowed)
        x = x + out
        maps.append(weights)
        if config.mlp:
            inner = _layer_norm(x, block["ln2"]) if config.layer_norm else x
            x = x + jax.nn.gelu(inner @ block["w1"] + block["b1"]) @ block["w2"] + block["b2"]
    if config.layer_norm:
        x = _layer_norm(x, params["ln_f"])
    last = x[-1]
    prediction = (last @ params["read_out"]["w"] + params["read_out"]["b"])[0] if config.embed else last[token_size - 1]
    return prediction, jnp.stack(maps)


@partial(jax.jit, static_argnums=2)
def gpt_predict(params: dict, tokens: jax.Array, config: GPTConfig) -> jax.Array:
    """Predictions for a batch of prompts (batch × n_tokens × token_size); compiled once per config and shape."""
    return jax.vmap(lambda t: gpt_forward(params, t, config)[0])(tokens)


def parameter_count(params) -> int:
    return int(sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(params)))


def flops_per_step(config: GPTConfig, token_size: int, n_tokens: int, batch: int) -> float:
    """Multiply–adds ×2 of one training step (forward ×3 for forward and backward) of the matrix products: the
    projections, QKᵀ, weights·V and the MLP (LayerNorm, softmax and Adam are lower order)."""
    width = config.width
    per_token = 4 * width * width + 2 * n_tokens * width + (8 * width * width if config.mlp else 0)
    flops = 2.0 * n_tokens * per_token * config.layers
    if config.embed:
        flops += 2.0 * n_tokens * token_size * width + 2.0 * width
    return 3.0 * batch * flops


# ------------------------------------------------------------------------------------------------------------
# The papers' one-layer models
# ------------------------------------------------------------------------------------------------------------

def one_nn_attention(W: jax.Array, tokens: jax.Array) -> jax.Array:
    """softmax(HᵀWh_q) over the N + 1 columns (docs/one_nn.md §2); tokens: (N+1) × (d+2), the query last."""
    return jax.nn.softmax(tokens @ (W @ tokens[-1]))


def one_nn_predict(W: jax.Array, tokens: jax.Array) -> jax.Array:
    """f_W(H) = [y_1, …, y_N, 0]·softmax(HᵀWh_q), batched over the first axis of ``tokens``."""
    return jax.vmap(lambda t: one_nn_attention(W, t) @ t[:, -2])(tokens)


def scb_predict(V: jax.Array, A: jax.Array, tokens: jax.Array, last: jax.Array, attention: str) -> jax.Array:
    """Model (2) of docs/scb.md §3, f = V X q⁽ᵏ⁾, k the last token, with q⁽ᵏ⁾ = A e_k (``attention="linear"``, A = Q)
    or q⁽ᵏ⁾ = softmax(A e_k) over the T positions (``"softmax"``, A = Z the logits; docs/deep.md §3). tokens: the
    context ids (batch × T), last: k (batch). Returns batch × N."""
    column = A[:, last].T  # batch × T: the attention column of each sample's last token
    weights = jax.nn.softmax(column, axis=-1) if attention == "softmax" else column
    one_hot = jax.nn.one_hot(tokens, V.shape[0], dtype=V.dtype)  # batch × T × N
    return jnp.einsum("nk,btk,bt->bn", V, one_hot, weights)


def scb_softmax_predict(V: jax.Array, Z: jax.Array, tokens: jax.Array, last: jax.Array) -> jax.Array:
    """:func:`scb_predict` with softmax attention: f = V X softmax(Z e_k)."""
    return scb_predict(V, Z, tokens, last, "softmax")


def scb_loss(V, A, batch, attention: str) -> jax.Array:
    """The minibatch loss of docs/scb.md §4, the batch mean of ½‖e_o − f‖²."""
    f = scb_predict(V, A, batch["tokens"], batch["last"], attention)
    return 0.5 * jnp.mean(jnp.sum((jax.nn.one_hot(batch["label"], V.shape[0], dtype=V.dtype) - f) ** 2, axis=-1))


def scb_preconditioned_gradients(V, A, batch, mu, attention: str):
    """The minibatch gradients with the preconditioner (4) of docs/scb.md §5: ∇_V L̂(D⁻¹ − 11ᵀ), and for the
    attention (I − 11ᵀ/T)∇_Q L̂ D⁻¹ (linear) or ∇_Z L̂ D⁻¹ (softmax, whose gradient already sums to 0 over the
    positions). Returns (loss, G_V, G_A)."""
    value, (grad_V, grad_A) = jax.value_and_grad(scb_loss, argnums=(0, 1))(V, A, batch, attention)
    G_V = grad_V / mu[None, :] - grad_V.sum(axis=1, keepdims=True)
    if attention == "linear":
        grad_A = grad_A - grad_A.mean(axis=0, keepdims=True)
    return value, G_V, grad_A / mu[None, :]


@partial(jax.jit, static_argnums=5)
def _scb_chunk(V, A, batches, mu, steps, attention):
    def one(carry, batch):
        V, A = carry
        value, G_V, G_A = scb_preconditioned_gradients(V, A, batch, mu, attention)
        V, A = V - steps[0] * G_V, A - steps[1] * G_A
        return (V, A), (V, A, value)

    (V, A), path = jax.lax.scan(one, (V, A), batches)
    return V, A, path


def scb_train(V, A, sample: Callable, steps: int, *, mu, eta_V: float, eta_A: float, attention: str,
              chunk: int = 10) -> dict:
    """Preconditioned online GD (eqs. 4–6 of docs/scb.md §5 with λ = 0) of model (2) with linear or softmax attention:
    V ← V − η_V G_V, A ← A − η_A G_A on a fresh batch each step, ``sample(n)`` giving n steps' batches (tokens,
    last, label) stacked on a leading axis. The step sizes are arguments of one compiled chunk per shape, so runs
    that differ only in them share it. Returns the iterates after every step (``V``, ``A``: steps × …, with the
    start prepended) and the minibatch losses."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    steps = check.integer(steps, "steps", minimum=1)
    V, A = jnp.asarray(V, jnp.float32), jnp.asarray(A, jnp.float32)
    mu = jnp.asarray(mu, jnp.float32)
    sizes = jnp.asarray([eta_V, eta_A], jnp.float32)
    Vs, As, losses = [np.asarray(V)[None]], [np.asarray(A)[None]], []
    done = 0
    while done < steps:
        n = min(chunk, steps - done)
        V, A, (path_V, path_A, values) = _scb_chunk(V, A, sample(n), mu, sizes, attention)
        Vs.append(np.asarray(path_V))
        As.append(np.asarray(path_A))
        losses.append(np.asarray(values))
        done += n
    losses = np.concatenate(losses)
    if not np.all(np.isfinite(losses)):
        raise DivergenceError(f"scb_train diverged: a minibatch loss is not finite (lower eta, now {eta_V}, {eta_A})")
    return dict(V=np.concatenate(Vs).astype(float), A=np.concatenate(As).astype(float), losses=losses)


def scb_samples(problem, n: int, rng: np.random.Generator) -> dict:
    """n samples of the data model (1) of docs/scb.md §2, drawn in numpy: x_1…x_T, x_{T+1} = k i.i.d. ~ μ, a
    position j ~ q*⁽ᵏ⁾, the label o ~ Pe_{x_j}. Returns int32 arrays tokens (n × T), last (n), label (n)."""
    n = check.integer(n, "n", minimum=1)
    T, N = problem.T, problem.N
    tokens = rng.choice(N, size=(n, T), p=problem.mu).astype(np.int32)
    last = rng.choice(N, size=n, p=problem.mu).astype(np.int32)
    position_cdf = np.cumsum(problem.Q_star, axis=0).T  # N × T: row k the law of j given k
    position = np.minimum((rng.random(n)[:, None] >= position_cdf[last]).sum(axis=1), T - 1)
    attended = tokens[np.arange(n), position]
    label_cdf = np.cumsum(problem.P, axis=0).T  # N × N: row a the law of o given the attended token a
    label = np.minimum((rng.random(n)[:, None] >= label_cdf[attended]).sum(axis=1), N - 1).astype(np.int32)
    return dict(tokens=tokens, last=last, label=label)


def softmax_columns(Z: np.ndarray) -> np.ndarray:
    """softmax over the positions (axis 0) of every column; also for a stack of Z's (… × T × N)."""
    Z = np.asarray(Z, float)
    e = np.exp(Z - Z.max(axis=-2, keepdims=True))
    return e / e.sum(axis=-2, keepdims=True)


def scb_population_path(problem, attention: str, steps: int, *, eta_V: float, eta_A: float) -> dict:
    """The population version of :func:`scb_train` (exact expected gradients): for linear attention the map of
    docs/scb.md §7 (``closed_forms.scb.population_map_step``, λ = 0); for softmax the same V-step and
    Z ← Z − η_A·J(q)ᵀ E∇_Q L D⁻¹, column by column, J(q) = diag(q) − qqᵀ the softmax Jacobian and E∇_Q L Lemma B.7
    (docs/deep.md §3). Returns V, Q (the attention, softmax(Z) for softmax) after every step, the start prepended."""
    from attnflow.closed_forms import scb as cf

    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    V, Q = problem.initial_point()
    Z = np.zeros_like(Q)
    Vs, Qs = [V], [Q]
    for _ in range(check.integer(steps, "steps", minimum=1)):
        if attention == "linear":
            V, Q = cf.population_map_step(problem, V, Q, eta_V, eta_A)
        else:
            G_V, _ = cf.preconditioned_gradients(problem, V, Q)
            _, grad_Q = cf.raw_gradients(problem, V, Q)
            grad_Z = Q * (grad_Q - (Q * grad_Q).sum(axis=0, keepdims=True))
            V, Z = V - eta_V * G_V, Z - eta_A * grad_Z / problem.mu[None, :]
            Q = softmax_columns(Z)
        Vs.append(V)
        Qs.append(Q)
    return dict(V=np.array(Vs), Q=np.array(Qs))


# ------------------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------------------

@dataclass
class TrainResult:
    """``params`` after training; ``steps`` and ``losses`` the recorded steps and the mean minibatch loss over the
    steps since the previous record; ``checkpoints`` the parameters at ``checkpoint_steps`` (if asked)."""

    params: dict
    steps: np.ndarray
    losses: np.ndarray
    checkpoints: dict
    seconds: float
    compile_seconds: float


OPTIMIZERS = ("adam", "sgd")

# Compiled chunks, reused by every run with the same loss function, optimizer, schedule and shapes: XLA's compile
# (seconds) dominates short runs, and a claim trains several models of one shape (docs/deep.md §1).
_COMPILED: dict = {}
_COMPILED_MAX = 64


def _shapes(tree) -> tuple:
    leaves, structure = jax.tree_util.tree_flatten(tree)
    return structure, tuple((np.shape(x), str(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype))
                            for x in leaves)


def train(loss: Callable, params, sample: Callable, steps: int, *, lr: float, chunk: int = 100,
          checkpoint_steps=(), decay: bool = True, optimizer: str = "adam") -> TrainResult:
    """Adam (or plain SGD, ``optimizer="sgd"``) on ``loss(params, batch)`` (a scalar), a fresh batch each step.

    ``sample(n)`` returns ``n`` steps' batches stacked on a leading axis (a pytree of arrays), drawn by the caller
    from its seed; ``chunk`` steps run in one compiled ``lax.scan`` and are recorded as one mean loss. The learning
    rate decays by a cosine to 1% of ``lr`` (``decay=False``: constant). ``checkpoint_steps`` must be multiples of
    ``chunk``. Raises ``DivergenceError`` naming the chunk if the loss stops being finite. A run reuses the compiled
    chunk of an earlier run with the same ``loss`` object, optimizer, ``lr``, ``steps``, schedule and shapes (its
    ``compile_seconds`` is then 0): pass one loss function per model, not a fresh closure per run."""
    import time

    steps = check.integer(steps, "steps", minimum=1)
    chunk = check.integer(chunk, "chunk", minimum=1)
    lr = check.real(lr, "lr", minimum=0.0, strict=True)
    wanted = set(int(s) for s in checkpoint_steps)
    if any(s % chunk or not 0 <= s <= steps for s in wanted):
        raise ValueError(f"checkpoint_steps must be multiples of chunk={chunk} within [0, {steps}]")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    optimizer_name = optimizer
    schedule = optax.cosine_decay_schedule(lr, steps, alpha=0.01) if decay else lr
    optimizer = optax.adam(schedule) if optimizer == "adam" else optax.sgd(schedule)
    state = optimizer.init(params)

    def one_step(carry, batch):
        p, s = carry
        value, grads = jax.value_and_grad(loss)(p, batch)
        updates, s = optimizer.update(grads, s, p)
        return (optax.apply_updates(p, updates), s), value

    @jax.jit
    def run_chunk(p, s, batches):
        (p, s), values = jax.lax.scan(one_step, (p, s), batches)
        return p, s, values.mean()

    recorded_steps, losses, checkpoints = [], [], {}
    if 0 in wanted:
        checkpoints[0] = params
    started = time.perf_counter()
    compile_seconds = 0.0
    done = 0
    while done < steps:
        n = min(chunk, steps - done)
        batches = sample(n)
        if done == 0 or n != chunk:
            key = (loss, optimizer_name, lr, steps, decay, _shapes((params, state, batches)))
            compiled = _COMPILED.get(key)
            if compiled is None:
                tick = time.perf_counter()
                compiled = run_chunk.lower(params, state, batches).compile()
                compile_seconds += time.perf_counter() - tick
                if len(_COMPILED) >= _COMPILED_MAX:
                    _COMPILED.pop(next(iter(_COMPILED)))
                _COMPILED[key] = compiled
        params, state, value = compiled(params, state, batches)
        done += n
        value = float(value)
        if not np.isfinite(value):
            raise DivergenceError(f"diverged in the steps up to {done}: the minibatch loss is {value} (lower lr={lr})")
        recorded_steps.append(done)
        losses.append(value)
        if done in wanted:
            checkpoints[done] = params
    return TrainResult(params=params, steps=np.array(recorded_steps), losses=np.array(losses),
                       checkpoints=checkpoints, seconds=time.perf_counter() - started,
                       compile_seconds=compile_seconds)
