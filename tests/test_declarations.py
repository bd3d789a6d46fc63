"""A claim declaration is checked when it is made: what would only fail later (under --full, by vanishing from
``list``, in a report without a basis) is refused at import, naming the claim and what is wrong."""
import pytest

from attnflow import Outcome, run_claim
from attnflow.validation import claims as claims_module
from attnflow.validation import systems
from attnflow.validation.claims import claim


@pytest.fixture(autouse=True)
def empty_registry(monkeypatch):
    """Declarations made here stay here: the real registry is left as it was."""
    monkeypatch.setattr(claims_module, "_REGISTRY", {})


def _function(seed, n, eta=0.1):
    return Outcome({"x": float(n)}, {"x": float(n)}, "exact", "an identity", passed=True)


DECLARATION = dict(reference="Paper, Theorem 1", statement="x equals n.", quick=dict(n=1), full=dict(n=2))


@pytest.mark.parametrize("change, message", [
    (dict(quick=dict(n=1, steps=5)), r"quick settings \['steps'\] are not parameters of _function"),
    (dict(full=dict(eta=0.2)), r"full settings leave \['n'\] unset"),
    (dict(statement="  "), "the statement must be a non-empty text"),
    (dict(reference=""), "the reference must be a non-empty text"),
    (dict(full=[("n", 2)]), "full must be a dict of settings"),
    (dict(finding=None), "finding must be a text"),
])
def test_a_bad_declaration_is_refused_when_made(change, message):
    with pytest.raises(ValueError, match=f"claim toy.x: {message}"):
        claim("toy.x", **{**DECLARATION, **change})(_function)


@pytest.mark.parametrize("name", ["toy", "Toy.x", "toy.x.y", "toy x", "toy.", ".x", "toy.2x"])
def test_a_name_that_is_not_system_dot_claim_is_refused(name):
    with pytest.raises(ValueError, match="must be 'system.claim'"):
        claim(name, **DECLARATION)(_function)


def test_registering_the_same_function_again_is_harmless_another_is_not():
    claim("toy.x", **DECLARATION)(_function)
    claim("toy.x", **DECLARATION)(_function)  # its module imported a second time
    assert list(claims_module.registered_claims()) == ["toy.x"]

    def other(seed, n):
        return _function(seed, n)

    with pytest.raises(ValueError, match="'toy.x' is registered twice"):
        claim("toy.x", **DECLARATION)(other)


def test_a_verdict_without_tolerance_or_basis_is_an_error():
    def no_basis(seed):
        return Outcome({"x": 1.0}, {"x": 1.0}, "exact", "", passed=True)

    claim("toy.no_basis", reference="r", statement="s", quick={}, full={})(no_basis)
    result = run_claim(claims_module.registered_claims()["toy.no_basis"], seed=0)
    assert result.status == "ERROR" and "tolerance and its basis" in result.notes
    assert result.measured == {"x": 1.0}  # the numbers are kept


def test_a_system_module_registering_claims_under_another_prefix_is_refused(monkeypatch):
    class Entry:
        value = f"{__name__}:SYSTEM"

        @staticmethod
        def load():
            claim("other.x", **DECLARATION)(_function)  # would vanish from `list toy` and `check toy`
            return systems.System(key="toy", title="t", reference="r", problem=_Problem, population=print,
                                  minibatch=print)

    monkeypatch.setattr(systems, "_entry_points", lambda: {"toy": Entry})
    monkeypatch.setattr(systems, "_LOADED", {})
    with pytest.raises(ValueError, match=r"system 'toy' registers claims under another system's name: other.x"):
        systems.get_system("toy")


class _Problem:
    PARAMETERS = ()

    @classmethod
    def from_params(cls, values):
        return cls()
