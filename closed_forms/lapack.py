"""LAPACK's ``dgesv`` called from compiled code without numba's ``np.linalg.solve`` machinery.

numba's ``np.linalg.solve`` is itself a call to ``dgesv`` from ``scipy.linalg.cython_lapack`` (through numba's own
C helper), wrapped in generic checks, copies and dtype dispatch whose compilation costs about 5 s CPU per kernel
that uses it. :func:`solve_into` makes the same call with the same inputs (the matrix copied to Fortran order, the
right-hand side copied, 32-bit LAPACK integers), so the solution is bit for bit the one ``np.linalg.solve`` returns,
and it compiles in a fraction of a second.

The function's address comes from scipy's public Cython API (``scipy.linalg.cython_lapack``, read by
``numba.extending.get_cython_function_address``) and is passed to kernels as an integer argument: an address
embedded as a constant would change with every process and make the caller uncacheable.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import get_cython_function_address, intrinsic

__all__ = ["DGESV", "solve_into"]

DGESV = get_cython_function_address("scipy.linalg.cython_lapack", "dgesv")  # the address np.linalg.solve calls


@intrinsic
def _dgesv_at(typingctx, address, n, a, ipiv, b):
    """dgesv(n, nrhs = 1, a, lda = n, ipiv, b, ldb = n, info) at ``address``; returns info. ``a`` (n × n, Fortran
    order, overwritten by its LU factors), ``ipiv`` (int32, n) and ``b`` (n, overwritten by the solution) are
    contiguous 1-D arrays."""
    vector = types.Array(types.float64, 1, "C")
    pivots = types.Array(types.int32, 1, "C")
    if not (isinstance(address, types.Integer) and isinstance(n, types.Integer) and a == vector and b == vector
            and ipiv == pivots):
        return None

    def codegen(context, builder, signature, args):
        address_value, n_value, a_value, ipiv_value, b_value = args
        int32 = ir.IntType(32)
        pointer_types = [int32.as_pointer(), int32.as_pointer(), ir.DoubleType().as_pointer(), int32.as_pointer(),
                         int32.as_pointer(), ir.DoubleType().as_pointer(), int32.as_pointer(), int32.as_pointer()]
        function = builder.inttoptr(address_value, ir.FunctionType(ir.VoidType(), pointer_types).as_pointer())
        order = builder.trunc(n_value, int32) if n_value.type.width > 32 else n_value
        n_slot = cgutils.alloca_once_value(builder, order)
        nrhs_slot = cgutils.alloca_once_value(builder, ir.Constant(int32, 1))
        info_slot = cgutils.alloca_once_value(builder, ir.Constant(int32, 0))
        a_data = context.make_array(signature.args[2])(context, builder, a_value).data
        ipiv_data = context.make_array(signature.args[3])(context, builder, ipiv_value).data
        b_data = context.make_array(signature.args[4])(context, builder, b_value).data
        builder.call(function, [n_slot, nrhs_slot, a_data, n_slot, ipiv_data, b_data, n_slot, info_slot])
        return builder.load(info_slot)

    return types.int32(address, n, a, ipiv, b), codegen


@njit(cache=True)
def solve_into(address, A, b, a_work, ipiv, x):
    """x = A⁻¹ b by LAPACK's ``dgesv`` at ``address`` (:data:`DGESV`), as ``np.linalg.solve(A, b)`` computes it.

    ``A`` (n × n) and ``b`` (n) are read; ``a_work`` (n·n) and ``ipiv`` (int32, n) are scratch, ``x`` (n) receives
    the solution. Raises ``np.linalg.LinAlgError`` with numba's messages for a non-finite input or a singular A."""
    n = b.shape[0]
    for i in range(n):
        for j in range(n):
            if not np.isfinite(A[i, j]):
                raise np.linalg.LinAlgError("Array must not contain infs or NaNs.")
    for i in range(n):
        if not np.isfinite(b[i]):
            raise np.linalg.LinAlgError("Array must not contain infs or NaNs.")
    for j in range(n):  # Fortran order: column j is contiguous
        for i in range(n):
            a_work[j * n + i] = A[i, j]
        x[j] = b[j]
    if _dgesv_at(address, n, a_work, ipiv, x) > 0:
        raise np.linalg.LinAlgError("Matrix is singular to machine precision.")
