"""Each of the integrators' numba workarounds (dynamics/numba_compat.py) does what it says on the installed numba."""
import numpy as np
import pytest
from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import overload

from attnflow.dynamics import numba_compat as compat

_SCALAR_TYPE = types.FunctionType(types.float64(types.float64, types.float64[::1]))


@njit(cache=True)
def _affine(x, p):
    return p[0] * x + p[1]


_affine_at = compat.function_from_address(_SCALAR_TYPE)


@njit(cache=True)
def _apply_at(address, x, p):
    return _affine_at(address)(x, p)


def test_the_first_class_layout_is_the_one_assumed_for_this_numba():
    """The address goes into jit_addr (numba >= 0.61) or addr (before): the struct must have that field."""
    from numba.core.datamodel import default_manager

    fields = default_manager.lookup(_SCALAR_TYPE)._fields
    assert ("jit_addr" in fields) == compat.CALLS_ENTRY_POINT
    assert ("addr" in fields) == (not compat.CALLS_ENTRY_POINT)


def test_a_function_called_by_its_address():
    address = compat.compiled_address(_affine, _SCALAR_TYPE, "affine")
    assert _apply_at(address, 2.0, np.array([3.0, 0.5])) == 6.5
    # the caller holds no per-process address, so numba can cache it
    assert not _apply_at.overloads[_apply_at.signatures[0]].library.has_dynamic_globals


def test_a_function_of_another_signature_is_refused_by_name():
    @njit
    def three_arguments(x, p, q):
        return x

    @njit
    def returns_a_vector(x, p):
        return p

    with pytest.raises(TypeError, match="^mine must take"):
        compat.compiled_address(three_arguments, _SCALAR_TYPE, "mine")
    with pytest.raises(TypeError, match="^mine must take .* and return float64"):
        compat.compiled_address(returns_a_vector, _SCALAR_TYPE, "mine")


_to_first_class = compat.first_class_cast(lambda dispatcher: _SCALAR_TYPE)


@njit
def _call_first_class(function, x, p):
    return function(x, p)


@njit
def _cast_and_call(x, p):
    return _call_first_class(_to_first_class(_affine), x, p)


def test_the_first_class_cast_pins_no_python_object():
    """Before numba 0.61 numba's own cast of a jitted function to a first-class one stores the function's Python
    address (a per-process constant: the caller cannot be cached); first_class_cast leaves it out and calls the same
    code, on every version."""
    p = np.array([3.0, 0.5])
    assert _cast_and_call(2.0, p) == 6.5
    assert not _cast_and_call.overloads[_cast_and_call.signatures[0]].library.has_dynamic_globals

    @njit
    def through_numbas_cast(x, p):
        return _call_first_class_typed(_affine, x, p)

    assert through_numbas_cast(2.0, p) == 6.5
    pinned = through_numbas_cast.overloads[through_numbas_cast.signatures[0]].library.has_dynamic_globals
    assert pinned == (compat.NUMBA_VERSION < (0, 61))


@njit(types.float64(_SCALAR_TYPE, types.float64, types.float64[::1]))
def _call_first_class_typed(function, x, p):
    return function(x, p)


@njit
def _rhs_into(t, y, p, out):
    out[0] = -p[0] * y[0]


@njit
def _rhs_returning(t, y, p):
    return -p[0] * y


@njit
def _evaluate_both(y, p):
    a, b = np.empty(1), np.empty(1)
    compat.evaluate_into(_rhs_into, 0.0, y, p, a)
    compat.evaluate_into(_rhs_returning, 0.0, y, p, b)
    return a[0], b[0]


def test_evaluate_into_calls_either_convention():
    y, p = np.array([2.0]), np.array([1.5])
    assert _evaluate_both(y, p) == (-3.0, -3.0)
    for rhs in (_rhs_into, _rhs_returning):  # the plain-Python path
        out = np.empty(1)
        compat.evaluate_into(rhs, 0.0, y, p, out)
        assert out[0] == -3.0
    assert compat.arity(_rhs_into) == 4 and compat.arity(_rhs_returning) == 3
    assert compat.arity(lambda t, y, p: y) == 3


@njit
def _double(x):
    return 2.0 * x


@njit
def _triple(x):
    return 3.0 * x


_SCALES = (_double, _triple)


def _scale(index, x):
    return _SCALES[index](x)


@overload(_scale, inline="always")
def _scale_jit(index, x):
    kernel = compat.literal_choice(index, _SCALES, "scale")

    def call(index, x):
        return kernel(x)
    return call


def test_a_constant_index_compiles_only_the_chosen_function():
    @njit
    def by_constant(x):
        return _scale(1, x)

    assert by_constant(2.0) == 6.0
    assert _triple.signatures and not _double.signatures  # the other function was never compiled

    @njit
    def by_variable(index, x):
        return _scale(index, x)

    with pytest.raises(TypingError, match="the index must be a constant"):
        by_variable(0, 2.0)


@njit
def _row_sums(matrix):
    """Sums of the rows of ``matrix`` through borrowed views of it, and a write through one of them."""
    work = matrix.copy()
    rows = compat.borrowed_rows(work, 1, 3)
    first = compat.borrowed_row(work, 0)
    whole = compat.borrowed(work)
    first[0] = 100.0  # the views share the work array's memory
    total = np.zeros(4)
    total[0] = first.sum()
    total[1] = rows[0].sum() + rows[1].sum()
    total[2] = whole.sum()
    total[3] = rows.shape[0]
    compat.keep_alive(work)
    return total


def test_borrowed_views_are_views():
    matrix = np.arange(12.0).reshape(3, 4)
    edited = matrix.copy()
    edited[0, 0] = 100.0
    np.testing.assert_array_equal(_row_sums(matrix), [edited[0].sum(), edited[1:].sum(), edited.sum(), 2])


def test_borrowed_views_refuse_other_arrays():
    @njit
    def row_of_a_strided_matrix(matrix):
        return compat.borrowed_row(matrix[:, ::2], 0).sum()

    with pytest.raises(TypingError):
        row_of_a_strided_matrix(np.ones((3, 4)))
