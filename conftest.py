"""Collection rules for the whole suite (tests/ and notebooks/): the deep tier's notebook needs the optional
attnflow[deep] (JAX, optax), so it is left out where that extra is not installed, as tests/test_deep.py skips."""
import importlib.util

collect_ignore = [] if all(importlib.util.find_spec(name) for name in ("jax", "optax")) else ["notebooks/deep.ipynb"]
