"""Two printed texts that say the same: the words equal, and each number within one unit of its last printed digit.

A stored output (a notebook's, a documented command's) is compared with a fresh run's this way: the same seed gives
the same numbers on one platform, but another CPU may move the last bits, and a rounding with them. Integers
(counts, sizes, seeds) must be equal."""
import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _allowed(printed: str) -> float:
    mantissa, _, exponent = printed.partition("e")
    if "." not in mantissa:
        return 0.0 if not exponent else 1.01 * 10.0 ** int(exponent)
    return 1.01 * 10.0 ** (int(exponent or 0) - len(mantissa.split(".")[1]))


def same_printed_numbers(stored: str, fresh: str) -> bool:
    words_stored, words_fresh = NUMBER.split(stored), NUMBER.split(fresh)
    numbers_stored, numbers_fresh = NUMBER.findall(stored), NUMBER.findall(fresh)
    if words_stored != words_fresh or len(numbers_stored) != len(numbers_fresh):
        return False
    return all(abs(float(a) - float(b)) <= _allowed(a) for a, b in zip(numbers_stored, numbers_fresh))
