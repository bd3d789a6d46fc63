"""The integrators' ways around numba's limits, in one place.

Each helper below says what it works around and on which numba releases that holds. All of them are exercised by
``tests/test_numba_compat.py``, which the suite runs on the installed numba; they were checked on numba 0.59.1
(the lowest ``setup.cfg`` allows) and 0.68.1. Under ``NUMBA_DISABLE_JIT=1`` each has a plain-Python twin, so the
loops that use them run as ordinary Python.

**Calling a compiled function by its address** (:func:`function_from_address`, :func:`compiled_address`). numba
cannot serve a cached function that receives another jitted function as an argument: the argument's type names the
function object, a different one in every process (numba issue 2956, open since numba 0.38, still so in 0.68). A
*first-class function* type (``types.FunctionType``, numba >= 0.49) names only a signature, so a loop taking one is
compiled once per signature and cached. The loops are therefore handed the address of the right-hand side's
compiled code as an integer and rebuild the first-class value from it. The value's layout changed in numba 0.61:
before, it held the address of the C wrapper of the function (``addr``) and called through that wrapper; from 0.61
it also holds the function's own entry point (``jit_addr``), which is called directly. Both are handled here.

**A first-class cast that pins nothing** (:func:`first_class_cast`). numba casts a jitted function to a first-class
function only where a signature asks for one, and before numba 0.61 that cast fetches the compiled code's address at
run time through the Python API, holding the GIL, and stores the Python object's address, a per-process constant
that makes the caller uncacheable. This cast, in any expression, links the function's code into the caller and
leaves the Python object out (what numba's own cast does from 0.61).

**Borrowed views** (:func:`borrowed`, :func:`borrowed_row`, :func:`borrowed_rows`, :func:`keep_alive`). numba counts
references to an array's memory with atomic operations whenever a view is taken, an array is bound to a new name or
passed to a compiled function (every release). On the adaptive loops' short states those updates cost more than the
arithmetic, so the loops use views with a null meminfo, as ``numba.carray`` makes, which numba does not count. Such
a view is valid only while the array it was taken from lives: :func:`keep_alive` is a use of that array placed
after the last use of its views, since numba releases a name after its last use.

**One call for two calling conventions** (:func:`evaluate_into`). A right-hand side either writes dy/dt into its
last argument or returns it; which one is a property of its type, decided at compile time. numba 0.59 removed
``generated_jit``, so the choice is an ``@overload``.

**Choosing a function by a constant** (:func:`literal_choice`). In ``if method == 0: f(...) else: g(...)`` numba
types and compiles both calls even when ``method`` is a constant of the caller (its branch pruning decides only
comparisons with ``None``; numba 0.59 to 0.68), so a loop specialised to one method would still compile every
method's kernels; a tuple of jitted functions indexed by the constant compiles one, but as an experimental feature
that warns. An ``@overload`` whose implementation is the function chosen from the literal index
(:func:`literal_choice`) compiles that one alone, with nothing in between.
"""
from __future__ import annotations

import inspect

import numba
from numba import config, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic, overload

__all__ = [
    "NUMBA_VERSION",
    "CALLS_ENTRY_POINT",
    "function_from_address",
    "compiled_address",
    "first_class_cast",
    "arity",
    "evaluate_into",
    "literal_choice",
    "borrowed",
    "borrowed_row",
    "borrowed_rows",
    "keep_alive",
]

NUMBA_VERSION = tuple(int(part) for part in numba.__version__.split(".")[:2])
# numba >= 0.61: a first-class function value holds (c_addr, py_addr, jit_addr) and calls jit_addr, the function's
# own entry point; before, it holds (addr, pyaddr) and calls addr, the function's C wrapper.
CALLS_ENTRY_POINT = NUMBA_VERSION >= (0, 61)


# ---- calling a compiled function by its address ---------------------------------------------------------------------


def _set_address(context, builder, value, address):
    """Fill the first-class function struct ``value`` so that calls go to ``address`` (an i8*); the other addresses
    null (never called)."""
    null = context.get_constant_null(types.voidptr)
    if CALLS_ENTRY_POINT:
        value.c_addr = null
        value.py_addr = null
        value.jit_addr = address
    else:
        value.addr = address
        value.pyaddr = null


def function_from_address(function_type: types.FunctionType):
    """An intrinsic ``f(address) -> first-class function of function_type`` whose calls go to the compiled code at
    ``address`` (an integer from :func:`compiled_address`, for the same signature)."""
    def codegen(context, builder, signature, args):
        value = cgutils.create_struct_proxy(function_type)(context, builder)
        _set_address(context, builder, value, builder.inttoptr(args[0], context.get_value_type(types.voidptr)))
        return value._getvalue()

    def function_at(typingctx, address):
        if not isinstance(address, types.Integer):
            return None
        return function_type(address), codegen

    return intrinsic(function_at)


def compiled_address(function, function_type: types.FunctionType, name: str) -> int:
    """Address to call ``function`` (a jitted dispatcher) at through a first-class value of ``function_type`` (its
    entry point, or its C wrapper before numba 0.61), compiling it for that signature if needed. A TypeError naming
    ``name`` if it does not type-check or returns another type. The address is valid while ``function`` lives."""
    signature = function_type.signature
    expected = f"{name} must take {signature.args} and return {signature.return_type}"
    if arity(function) != len(signature.args):  # checked here: numba 0.59 reports it through a deprecation warning
        raise TypeError(f"{expected}, not {arity(function)} arguments")
    try:
        compiled = function.get_compile_result(signature)
    except TypingError as error:
        raise TypeError(f"{expected}; numba: {str(error).splitlines()[0]}") from error
    if compiled.signature.return_type != signature.return_type:  # numba 0.59 compiles it with its own return type
        raise TypeError(f"{expected}, not {compiled.signature.return_type}")
    symbol = compiled.fndesc.llvm_func_name if CALLS_ENTRY_POINT else compiled.fndesc.llvm_cfunc_wrapper_name
    return compiled.library.get_pointer_to_function(symbol)


# ---- a first-class cast that pins nothing ------------------------------------------------------------------------


def first_class_cast(function_type_of):
    """An intrinsic ``f(jitted function) -> first-class function`` of the type ``function_type_of(dispatcher type)``
    (a ``types.FunctionType``), holding only the compiled code's addresses; the identity under NUMBA_DISABLE_JIT."""
    if config.DISABLE_JIT:
        return lambda function: function

    def cast(typingctx, function):
        if not isinstance(function, types.Dispatcher):
            return None
        function_type = function_type_of(function)

        def codegen(context, builder, signature, args):
            compiled = function.dispatcher.get_compile_result(function_type.signature)
            void_pointer = context.get_value_type(types.voidptr)
            value = cgutils.create_struct_proxy(function_type)(context, builder)
            wrapper_type = context.get_value_type(function_type.ftype).pointee
            wrapper = cgutils.get_or_insert_function(builder.module, wrapper_type,
                                                     compiled.fndesc.llvm_cfunc_wrapper_name)
            if CALLS_ENTRY_POINT:
                _set_address(context, builder, value,
                             builder.bitcast(context.declare_function(builder.module, compiled.fndesc), void_pointer))
                value.c_addr = builder.bitcast(wrapper, void_pointer)
            else:
                _set_address(context, builder, value, builder.bitcast(wrapper, void_pointer))
            context.active_code_library.add_linking_library(compiled.library)
            return value._getvalue()

        return function_type(function), codegen

    return intrinsic(cast)


# ---- one call for two calling conventions ----------------------------------------------------------------------------


def arity(function) -> int:
    """Number of arguments of a jitted function, of its numba type (a dispatcher or first-class function type) or of
    a Python function."""
    if isinstance(function, types.FunctionType):
        return function.nargs
    if isinstance(function, types.Dispatcher):
        function = function.dispatcher.py_func
    return len(inspect.signature(getattr(function, "py_func", function)).parameters)


def evaluate_into(rhs, t, y, params, out):
    """``out <- rhs(t, y, params)`` for ``rhs(t, y, params, out)`` (writes into ``out``) and for ``rhs(t, y, params)
    -> dy/dt`` alike (plain Python; compiled code uses the overload below, inlined)."""
    if arity(rhs) == 4:
        rhs(t, y, params, out)
    else:
        out[:] = rhs(t, y, params)


@overload(evaluate_into, inline="always")
def _evaluate_into_jit(rhs, t, y, params, out):
    if arity(rhs) == 4:
        def into(rhs, t, y, params, out):
            rhs(t, y, params, out)
        return into

    def copy(rhs, t, y, params, out):
        value = rhs(t, y, params)
        for i in range(out.size):  # an element loop: a slice assignment compiles numba's shape-error formatting
            out[i] = value[i]
    return copy


# ---- choosing a function by a constant -------------------------------------------------------------------------------


def literal_choice(index, functions, name: str):
    """``functions[index]`` for the numba type ``index`` of a constant (an integer literal), while typing an
    ``@overload``: returned as the overload's implementation, the chosen function is compiled, and only that one. A
    TypingError naming ``name`` for any other index."""
    if not isinstance(index, types.IntegerLiteral):
        raise TypingError(f"{name}: the index must be a constant of the caller, not {index}")
    return functions[index.literal_value]


# ---- borrowed views ------------------------------------------------------------------------------------------------


def _borrowed_value(context, builder, array_type, data, shape, strides, itemsize):
    """An array of ``array_type`` over ``data`` with a null meminfo and parent."""
    view = context.make_array(array_type)(context, builder)
    context.populate_array(view, data=data, shape=shape, strides=strides, itemsize=itemsize, meminfo=None)
    return view._getvalue()


def _c_array(typ, ndim=None) -> bool:
    return isinstance(typ, types.Array) and typ.layout == "C" and (ndim is None or typ.ndim == ndim)


@intrinsic
def _borrowed_array(typingctx, array):
    """A C-contiguous array as a borrowed view of itself (same type)."""
    if not _c_array(array):
        return None

    def codegen(context, builder, signature, args):
        source = context.make_array(array)(context, builder, args[0])
        return _borrowed_value(context, builder, array, source.data, cgutils.unpack_tuple(builder, source.shape),
                               cgutils.unpack_tuple(builder, source.strides), source.itemsize)

    return array(array), codegen


def _row_start(context, builder, signature, args):
    """(the 2-D array ``args[0]``, its row length, the address of its row ``args[1]``)."""
    source = context.make_array(signature.args[0])(context, builder, args[0])
    index = context.cast(builder, args[1], signature.args[1], types.intp)
    n = builder.extract_value(source.shape, 1)
    return source, n, builder.gep(source.data, [builder.mul(index, n)])


@intrinsic
def _borrowed_rows(typingctx, matrix, start, stop):
    """Rows ``start:stop`` (``0 <= start <= stop <= len``, not checked) of a C-contiguous 2-D array, borrowed."""
    if not (_c_array(matrix, 2) and isinstance(start, types.Integer) and isinstance(stop, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        source, n, data = _row_start(context, builder, signature, args)
        first = context.cast(builder, args[1], signature.args[1], types.intp)
        last = context.cast(builder, args[2], signature.args[2], types.intp)
        return _borrowed_value(context, builder, matrix, data, [builder.sub(last, first), n],
                               cgutils.unpack_tuple(builder, source.strides), source.itemsize)

    return matrix(matrix, start, stop), codegen


@intrinsic
def _borrowed_row(typingctx, matrix, index):
    """Row ``index`` (not checked) of a C-contiguous 2-D array as a borrowed 1-D view."""
    if not (_c_array(matrix, 2) and isinstance(index, types.Integer)):
        return None
    row_type = matrix.copy(ndim=1)

    def codegen(context, builder, signature, args):
        source, n, data = _row_start(context, builder, signature, args)
        return _borrowed_value(context, builder, row_type, data, [n], [builder.extract_value(source.strides, 1)],
                               source.itemsize)

    return row_type(matrix, index), codegen


@intrinsic
def _hold(typingctx, array):
    """A use of ``array`` that does nothing: numba releases a name after its last use, and this is the last."""
    if not isinstance(array, types.Array):
        return None
    return types.none(array), lambda context, builder, signature, args: context.get_dummy_value()


if config.DISABLE_JIT:  # plain Python: ordinary views, and nothing to hold
    def borrowed(array):
        return array

    def borrowed_row(matrix, index):
        return matrix[index]

    def borrowed_rows(matrix, start, stop):
        return matrix[start:stop]

    def keep_alive(array):
        pass
else:
    borrowed, borrowed_row, borrowed_rows, keep_alive = _borrowed_array, _borrowed_row, _borrowed_rows, _hold
