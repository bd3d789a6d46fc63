"""Deep tier: the JAX trainer's steps per second against a plain numpy forward/backward/Adam step of the same
decoder, the FLOPs of a step against the machine's measured GEMM rate (the floor), and the compile time of the jitted
step. A script, not a test.

The model (docs/deep.md §1): ``GPTConfig(mlp=False, layer_norm=False, attention="softmax", mask="causal",
embed=True)``, a decoder of softmax attention blocks without MLP and without LayerNorm, with a linear read-in, learned
positions and a linear read-out at the last token, trained on the squared loss by Adam with the trainer's cosine
schedule. The numpy contender implements exactly that model's forward pass, its backward pass by hand and the same
Adam update, in float32 like JAX; the table reports the largest relative difference of its gradient from JAX's
(autodiff) as a check that both compute the same step. Both run on pre-drawn batches, so sampling is not timed.

Contenders, side by side in this process (CPU time, ``OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1``; XLA on one thread,
as ``dynamics.deep`` sets it):
  * attnflow: ``dynamics.deep.train``, ``chunk`` steps per compiled ``lax.scan``, the compiled chunk reused.
  * numpy: one step at a time in Python.
Floor: ``flops_per_step`` (the matrix products, forward ×3) over the float32 GEMM rate of a large square product on
this core (and, for reference, the float64 rate of ``_common.gemm_rate``).

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python benchmarks/bench_deep.py [--steps 200] [--json]
"""
from __future__ import annotations

import importlib.util
import math
import sys
import time

import numpy as np

from _common import cpu_seconds, emit, gemm_rate, parser

SIZES = {  # name: (layers, heads, width, context points N, token size d + 1, batch)
    "small (quick claims)": (2, 2, 32, 12, 4, 64),
    "GPT-2 small shape": (6, 4, 128, 40, 21, 64),
}
LR = 1e-3


def float32_gemm_rate(n: int = 512, repeats: int = 7) -> float:
    """float32 GEMM rate (flop/s) of an n × n product on this core (``_common.gemm_rate`` in float32)."""
    return gemm_rate(n, n, n, repeats, dtype=np.float32)


# ------------------------------------------------------------------------------------------------------------
# The numpy contender: forward, backward and Adam of the decoder without MLP and LayerNorm
# ------------------------------------------------------------------------------------------------------------

def numpy_params(params) -> dict:
    out = dict(w_in=np.asarray(params["read_in"]["w"]), b_in=np.asarray(params["read_in"]["b"]),
               positions=np.asarray(params["positions"]), w_out=np.asarray(params["read_out"]["w"]),
               b_out=np.asarray(params["read_out"]["b"]))
    for i, block in enumerate(params["blocks"]):
        for name in ("wq", "wk", "wv", "wo"):
            out[f"{name}{i}"] = np.asarray(block[name])
    return out


def numpy_loss_and_gradient(p: dict, tokens: np.ndarray, y: np.ndarray, layers: int, heads: int):
    """The squared loss of the prediction at the last token and its gradient, by hand (float32)."""
    batch, n, _ = tokens.shape
    width = p["w_in"].shape[1]
    dh = width // heads
    scale = np.float32(1 / math.sqrt(dh))
    masked = np.triu(np.ones((n, n), bool), 1)  # causal: token i sees j <= i

    def split(x):  # B × n × width -> B × heads × n × dh
        return x.reshape(batch, n, heads, dh).transpose(0, 2, 1, 3)

    def merge(x):
        return x.transpose(0, 2, 1, 3).reshape(batch, n, width)

    x = tokens @ p["w_in"] + p["b_in"] + p["positions"][:n]
    cache = []
    for i in range(layers):
        q, k, v = split(x @ p[f"wq{i}"].T), split(x @ p[f"wk{i}"].T), split(x @ p[f"wv{i}"].T)
        scores = q @ k.transpose(0, 1, 3, 2) * scale
        scores[..., masked] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        out = merge(weights @ v)
        cache.append((x, q, k, v, weights, out))
        x = x + out @ p[f"wo{i}"].T
    last = x[:, -1]
    prediction = (last @ p["w_out"])[:, 0] + p["b_out"][0]
    residual = prediction - y
    loss = float(np.mean(residual ** 2))

    g = {}
    d_pred = (2.0 / batch) * residual
    g["w_out"] = last.T @ d_pred[:, None]
    g["b_out"] = np.array([d_pred.sum()], np.float32)
    dx = np.zeros_like(x)
    dx[:, -1] = d_pred[:, None] * p["w_out"][:, 0]
    for i in reversed(range(layers)):
        x_in, q, k, v, weights, out = cache[i]
        g[f"wo{i}"] = np.einsum("bni,bnj->ij", dx, out)
        d_heads = split(dx @ p[f"wo{i}"])
        d_weights = d_heads @ v.transpose(0, 1, 3, 2)
        dv = weights.transpose(0, 1, 3, 2) @ d_heads
        d_scores = weights * (d_weights - (d_weights * weights).sum(axis=-1, keepdims=True)) * scale
        dq, dk = d_scores @ k, d_scores.transpose(0, 1, 3, 2) @ q
        dq, dk, dv = merge(dq), merge(dk), merge(dv)
        g[f"wq{i}"] = np.einsum("bni,bnj->ij", dq, x_in)
        g[f"wk{i}"] = np.einsum("bni,bnj->ij", dk, x_in)
        g[f"wv{i}"] = np.einsum("bni,bnj->ij", dv, x_in)
        dx = dx + dq @ p[f"wq{i}"] + dk @ p[f"wk{i}"] + dv @ p[f"wv{i}"]
    g["w_in"] = np.einsum("bnt,bnw->tw", tokens, dx)
    g["b_in"] = dx.sum(axis=(0, 1))
    g["positions"] = dx.sum(axis=0)
    return loss, g


def numpy_train(p: dict, batches: dict, layers: int, heads: int, steps: int) -> dict:
    """Adam (β = 0.9, 0.999, ε = 1e-8, optax's defaults) with optax's cosine decay to 1% of LR over ``steps``."""
    m = {k: np.zeros_like(v) for k, v in p.items()}
    s = {k: np.zeros_like(v) for k, v in p.items()}
    p = {k: v.copy() for k, v in p.items()}
    for t in range(steps):
        _, g = numpy_loss_and_gradient(p, batches["tokens"][t], batches["y"][t], layers, heads)
        lr = LR * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * t / steps)))
        for key in p:
            m[key] = 0.9 * m[key] + 0.1 * g[key]
            s[key] = 0.999 * s[key] + 0.001 * g[key] ** 2
            p[key] -= np.float32(lr) * (m[key] / (1 - 0.9 ** (t + 1))) / (np.sqrt(s[key] / (1 - 0.999 ** (t + 1))) + 1e-8)
    return p


def main():
    p = parser(__doc__)
    p.add_argument("--steps", type=int, default=200, help="training steps per timing (a multiple of --chunk)")
    p.add_argument("--chunk", type=int, default=100)
    p.add_argument("--numpy-steps", type=int, default=20, help="steps per numpy timing (it is slower)")
    args = p.parse_args()
    if importlib.util.find_spec("jax") is None or importlib.util.find_spec("optax") is None:
        print("attnflow: error: attnflow[deep] is not installed: pip install -e '.[deep]'", file=sys.stderr)
        return 2
    import jax
    import jax.numpy as jnp

    from attnflow.dynamics import deep

    rate32, rate64 = float32_gemm_rate(), gemm_rate(512, 512, 512)
    rows, ratios = [], {}
    for label, (layers, heads, width, N, token_size, batch) in SIZES.items():
        config = deep.GPTConfig(layers=layers, heads=heads, width=width, mlp=False, layer_norm=False)
        n_tokens = N + 1
        params = deep.init_gpt(deep.jax_key(0), config, token_size, n_tokens)
        rng = np.random.default_rng(0)
        steps = args.steps
        data = dict(tokens=rng.standard_normal((steps, batch, n_tokens, token_size)).astype(np.float32),
                    y=rng.standard_normal((steps, batch)).astype(np.float32))

        def loss(q, b, config=config):
            return jnp.mean((deep.gpt_predict(q, b["tokens"], config) - b["y"]) ** 2)

        def sampler():
            done = [0]

            def sample(n):
                start, done[0] = done[0], done[0] + n
                return {k: v[start:start + n] for k, v in data.items()}

            return sample

        def run_jax():
            result = deep.train(loss, params, sampler(), steps, lr=LR, chunk=args.chunk)
            jax.block_until_ready(result.params)
            return result

        start = time.process_time()
        first = run_jax()  # compiles the chunk: its compile time, not counted below
        cold = time.process_time() - start
        compile_seconds = first.compile_seconds
        t_jax = min(cpu_seconds(run_jax) for _ in range(args.repeats)) / steps
        np_params = numpy_params(params)
        numpy_steps = min(args.numpy_steps, steps)
        t_numpy = min(cpu_seconds(lambda: numpy_train(np_params, data, layers, heads, numpy_steps))
                      for _ in range(max(1, args.repeats // 2))) / numpy_steps

        # the same gradient: numpy by hand against JAX autodiff, on the first batch
        batch0 = {k: v[0] for k, v in data.items()}
        _, g_np = numpy_loss_and_gradient(np_params, batch0["tokens"], batch0["y"], layers, heads)
        g_jax = numpy_params(jax.grad(loss)(params, batch0))
        gradient_error = max(float(np.abs(g_np[k] - g_jax[k]).max() / (np.abs(g_jax[k]).max() + 1e-30)) for k in g_np)

        flops = deep.flops_per_step(config, token_size, n_tokens, batch)
        floor = flops / rate32
        key = "small" if label.startswith("small") else "gpt2_small_shape"
        rows += [[f"{label}: CPU s per step (numpy / JAX)", t_numpy, t_jax, t_numpy / t_jax],
                 [f"{label}: steps per second", 1 / t_numpy, 1 / t_jax, ""],
                 [f"{label}: GFLOP per step; JAX step / float32 GEMM floor", "", flops / 1e9, t_jax / floor],
                 [f"{label}: compile s of the jitted chunk ({args.chunk} steps); first run CPU s", "",
                  compile_seconds, cold],
                 [f"{label}: max relative gradient difference numpy vs JAX", "", gradient_error, ""]]
        ratios[f"deep_{key}_speedup_vs_numpy"] = t_numpy / t_jax
        ratios[f"deep_{key}_step_over_floor"] = t_jax / floor
        ratios[f"deep_{key}_compile_seconds"] = compile_seconds
    rows.append(["GEMM rate, GFLOP/s (float32 / float64, 512³)", "", rate32 / 1e9, rate64 / 1e9])
    emit("deep tier: JAX trainer against numpy, the GEMM floor, compile time",
         ["quantity", "numpy", "JAX", "ratio"], rows, ratios, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
