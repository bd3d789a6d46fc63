"""Losses of a softmax-attention head on its token values, and their gradient in the logits, in log scale: the
shared mathematics of the attention-SVM papers (docs/attention_svm.md §2.3) and of next-token prediction with an
identity head (docs/next_token_scc.md §2.2). Both systems call this one kernel.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from attnflow.closed_forms.softmax import max_propagating_nan

__all__ = ["LOSSES", "LOSS_CODE", "LOG_LOSS_CODE", "log_scaled_logit_gradient"]

LOSSES = ("logistic", "linear", "exp")
LOSS_CODE = {name: k for k, name in enumerate(LOSSES)}
# The log-loss ℓ(u) = −log u of a head with values in [0, 1] (not a choice of AttentionSVMProblem: its u is not a
# probability); next_token_scc's identity head uses it (docs/next_token_scc.md §2.2).
LOG_LOSS_CODE = 3


@njit(cache=True)
def log_scaled_logit_gradient(logit, a, Y, loss_code):
    """dL/dl_it = e^c D_it (§2.3, eq. 2.3a) with D computed without cancellation or underflow.

    logit, a : (n, T) logits and token values; Y : (n,). ``loss_code`` indexes LOSSES, or is LOG_LOSS_CODE for the
    log-loss ℓ(u) = −log u of a head with values a_it ∈ [0, 1] and Y = 1 (next-token prediction with the identity head,
    docs/next_token_scc.md §2.2): there log|ℓ'(u)| = −log u, u and ℓ(u) = −log1p(−Σ_t s_it(1 − a_it)) are formed from
    the log-softmax, so neither u nor 1 − u is a difference.  Returns (D, c, loss, log_loss, unsat) where
    c = max_i[log|ℓ'(u_i)| + max_{t≠τ}(log s_it + log s_iτ)], ``loss`` = L, ``log_loss`` = log L and
    ``unsat`` = max_i (1 − max_t s_it), computed as a sum of the small probabilities."""
    n, T = logit.shape
    logs = np.empty((n, T))
    u = np.empty(n)
    lp = np.empty(n)
    log_miss = np.empty(n)  # explicit loops below instead of array API: they compile several times faster
    unsat = 0.0
    for i in range(n):
        log_miss[i] = -np.inf
        m = max_propagating_nan(logit[i])
        total = 0.0
        for t in range(T):
            total += np.exp(logit[i, t] - m)
        lse = m + np.log(total)
        top = 0
        for t in range(T):
            logs[i, t] = logit[i, t] - lse
            if logs[i, t] > logs[i, top]:
                top = t
        rest = 0.0
        f = 0.0
        for t in range(T):
            f += np.exp(logs[i, t]) * a[i, t]
            if t != top:
                rest += np.exp(logs[i, t])
        unsat = max(unsat, rest)
        u[i] = Y[i] * f
        if loss_code == 0:
            lp[i] = -np.logaddexp(0.0, u[i])
        elif loss_code == 1:
            lp[i] = 0.0
        elif loss_code == LOG_LOSS_CODE:
            # log u = log Σ_t s_t a_t and log(1 − u) = log Σ_t s_t (1 − a_t), both in log scale
            log_u = -np.inf
            log_miss[i] = -np.inf
            for t in range(T):
                if a[i, t] > 0.0:
                    log_u = np.logaddexp(log_u, logs[i, t] + np.log(a[i, t]))
                if a[i, t] < 1.0:
                    log_miss[i] = np.logaddexp(log_miss[i], logs[i, t] + np.log(1.0 - a[i, t]))
            lp[i] = -log_u
        else:
            lp[i] = -u[i]
    # log of the loss (its sum is formed in log scale so exponential/logistic losses never underflow)
    ell = np.empty(n)
    for i in range(n):
        if loss_code == 0:
            ell[i] = np.logaddexp(0.0, -u[i])
        elif loss_code == 1:
            ell[i] = -u[i]
        elif loss_code == LOG_LOSS_CODE:
            ell[i] = -np.log1p(-np.exp(log_miss[i]))
        else:
            ell[i] = np.exp(-u[i])
    loss = 0.0
    for i in range(n):
        loss += ell[i]
    loss = loss / n
    log_loss = np.nan
    if loss_code != 1:
        logl = np.empty(n)
        for i in range(n):
            if loss_code == 0:
                # log log(1 + e^{-u}); for large u, log(1+e^{-u}) ≈ e^{-u} and its log is −u
                logl[i] = np.log(ell[i]) if ell[i] > 1e-300 else -u[i]
            elif loss_code == LOG_LOSS_CODE:
                # −log(1 − m) = m(1 + O(m)): log of the loss is log m where m underflows
                logl[i] = np.log(ell[i]) if ell[i] > 1e-300 else log_miss[i]
            else:
                logl[i] = -u[i]
        mx = max_propagating_nan(logl)
        if mx == -np.inf:  # every sample's loss is exactly 0
            log_loss = -np.inf
        else:
            s = 0.0
            for i in range(n):
                s += np.exp(logl[i] - mx)
            log_loss = mx + np.log(s) - np.log(n)
    c = -np.inf
    for i in range(n):
        a1 = -np.inf
        a2 = -np.inf
        for t in range(T):
            if logs[i, t] > a1:
                a2 = a1
                a1 = logs[i, t]
            elif logs[i, t] > a2:
                a2 = logs[i, t]
        c = max(c, lp[i] + a1 + a2)
    D = np.empty((n, T))
    for i in range(n):
        for t in range(T):
            acc = 0.0
            for tau in range(T):
                if tau != t:
                    acc += np.exp(lp[i] + logs[i, t] + logs[i, tau] - c) * (a[i, t] - a[i, tau])
            # ℓ' < 0, so dL/dl = −|ℓ'| Y s (a − f)/n
            D[i, t] = -Y[i] * acc / n
    return D, c, loss, log_loss, unsat
