"""
Triton 3.6's interpreter, as the tests run the kernels on the CPU (TRITON_INTERPRET=1), made to compute what a GPU
computes, and without a redundant step of its own: three patches of the interpreter alone (the compiled path is
untouched), applied by conftest.py and by tests/selection_passes.py before any kernel runs. `patch()` does nothing
without triton.
"""


def patch():
    try:
        from triton.runtime import interpreter  # noqa: F401
    except ImportError:  # an optional extra (requirements-extras.txt): no kernel runs
        return
    patch_scalars()
    patch_bf16_dot()
    patch_nested_calls()


def patch_scalars():
    """numpy >= 2.4 refuses int() of a one-element array, which is how the interpreter holds a scalar (a loop bound
    such as T): its index is taken from the element instead."""
    from triton.runtime import interpreter
    if not hasattr(interpreter, '_patch_lang_tensor'):  # another triton: nothing to patch
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, '__index__', lambda self: int(self.handle.data.reshape(-1)[0]))
    interpreter._patch_lang_tensor = patched


def patch_bf16_dot():
    """The interpreter holds bfloat16 as uint16, and its tl.dot multiplies those raw bits: bfloat16 operands are
    widened to float32 first here (exactly), as a GPU's tensor cores take them."""
    import triton.language as tl
    from triton.runtime import interpreter
    builder, dot = interpreter.InterpreterBuilder, interpreter.InterpreterBuilder.create_dot

    def widened(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None)  # as the interpreter's casts do
        return interpreter.TensorHandle(data.view(interpreter._get_np_dtype(tl.float32)), tl.float32)

    builder.create_dot = lambda self, a, b, d, *rest: dot(self, widened(a), widened(b), d, *rest)


def patch_nested_calls():
    """The interpreter patches triton.language for a kernel's run, then again at every call of a @jit function inside
    it (each tile's load_rows, ...), with the same patch on the same modules, never undone: about a tenth of a kernel
    test's time. A call inside a kernel whose modules the kernel's patch covers runs the function alone here."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter
    executor, function = interpreter.GridExecutor, interpreter.InterpretedFunction
    if not hasattr(interpreter, '_patch_lang') or not hasattr(executor, '__call__'):  # another triton
        return
    run, call, patched, found = executor.__call__, function.__call__, [], {}  # patched: the running kernels' modules

    def langs(fn):  # the triton.language modules fn sees, as the interpreter's patch finds them
        if fn not in found:
            found[fn] = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        return found[fn]

    def running(self, *args, **kwargs):
        patched.append(langs(self.fn))
        try:
            return run(self, *args, **kwargs)
        finally:
            patched.pop()

    def called(self, *args, **kwargs):
        if not patched or not langs(self.fn) <= patched[-1]:
            return call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # as the interpreter's own call reports it
            raise interpreter.InterpreterError(repr(e)) from e
    executor.__call__, function.__call__ = running, called
