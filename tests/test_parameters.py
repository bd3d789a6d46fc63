"""Named parameters from text or values: one parser, the same errors for every system."""
import numpy as np
import pytest

from attnflow.closed_forms.parameters import Parameter, parse_parameters

SPECS = (Parameter("N", "integer", 10, "size", minimum=1, maximum=1000),
         Parameter("sigma2", "real", 0.25, "noise", minimum=0.0),
         Parameter("H", "matrix", 1.0, "covariance"),
         Parameter("beta", "vector", None, "mean"),
         Parameter("flag", "boolean", False, "a switch"),
         Parameter("model", "choice", "a", "which", choices=("a", "b")))


def test_text_and_values_parse_to_the_same_checked_values():
    parsed = parse_parameters(SPECS, {"N": "1e2", "sigma2": "0.5", "H": "1,.3;.3,.6", "beta": "2,0", "flag": "true",
                                      "model": "b"}, owner="toy")
    assert parsed["N"] == 100 and isinstance(parsed["N"], int) and parsed["sigma2"] == 0.5
    assert np.array_equal(parsed["H"], [[1, 0.3], [0.3, 0.6]]) and np.array_equal(parsed["beta"], [2, 0])
    assert parsed["flag"] is True and parsed["model"] == "b"
    assert parse_parameters(SPECS, {"N": 7, "H": 2.0}, owner="toy")["H"].shape == ()
    assert parse_parameters(SPECS, {}, owner="toy")["beta"] is None


@pytest.mark.parametrize("values, message", [
    ({"colour": "3"}, r"unknown toy parameter\(s\) \['colour'\]"),
    ({"N": "2.5"}, "parameter N must be an integer"),
    ({"N": "inf"}, "parameter N must be finite"),
    ({"N": "1,2"}, "parameter N must be an integer"),
    ({"N": "0"}, "parameter N must be >= 1"),
    ({"N": "1e6"}, "parameter N must be <= 1000"),
    ({"sigma2": "-1"}, "parameter sigma2 must be >= 0"),
    ({"sigma2": "abc"}, "parameter sigma2 must be a real number"),
    ({"H": "1,2;3"}, "every row of a matrix needs the same number of entries"),
    ({"H": "1,nan"}, "parameter H must be finite"),
    ({"flag": "maybe"}, "parameter flag must be true or false"),
    ({"model": "c"}, "parameter model must be one of a, b"),
    ({"N": True}, "parameter N must be an integer"),
])
def test_bad_values_are_refused_by_name(values, message):
    with pytest.raises(ValueError, match=message):
        parse_parameters(SPECS, values, owner="toy")
