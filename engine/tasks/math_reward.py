"""A built-in math reward on Hugging Face's ``math-verify``, of verl's signature:
``task.reward = "shunter.engine.tasks.math_reward:compute_score"``.

Invariants:

- the answer is what math-verify extracts from the response: the last ``\\boxed{}`` first (boxes
  side by side are read as one list of answers, as math-verify reads them), else an anchored
  ``answer: ...`` / ``final answer is ...``, else the last LaTeX expression or number. The
  ground truth is parsed as LaTeX: a bare one (``19``, ``\\frac{1}{2}``, ``x^2+1``) is wrapped
  in ``$...$`` first, one with a ``$`` or a ``\\boxed{}`` of its own is parsed as it is. The
  score is 1.0 when math-verify finds them equal (``\\boxed{0.5}`` and ``1/2``), else 0.0;
- a response it cannot read (empty, garbage, no answer) scores 0.0 and never raises. A ground
  truth it cannot read raises ``ValueError`` naming it, which the engine scores 0.0 and reports
  (``RewardFailed``): a broken dataset is seen, not trained on as zeros in silence;
- math-verify runs with its own timeouts off (they are ``signal.alarm``: main thread only), so
  it works in the replica's reward threads; the engine bounds each call
  (``task.reward_timeout_s``);
- what no thread timeout could stop is screened out first. sympy computes exact powers,
  factorials and binomials in C, holding the interpreter (the LaTeX parser computes some as it
  reads them), and the parser takes time exponential in the depth of nested brackets. So a text
  that writes a number past :data:`MAX_BITS` bits (``9^{9^{9^9}}``, ``2^{10^{10}}``, a binomial
  or Gamma of a 6-digit number, a matrix built by size) or nests brackets deeper than
  :data:`MAX_DEPTH` is not parsed, and a parsed expression that may hold such a number
  (``(10^{10})!``, ``e^{e^{e^{100}}}``) is not compared: a response scores 0.0, a ground truth
  raises. This screens what a model writes; it is no sandbox: a run that must survive any
  input runs its rewards in reward workers (``task.reward_workers``), which are killed and
  started again when a call holds the interpreter.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

MAX_BITS = 100_000
"""The largest exact number compared, in bits (about 30,000 decimal digits)."""
MAX_DEPTH = 10
"""The deepest nesting of brackets parsed. ANTLR's Python runtime (the LaTeX parser) takes time
exponential in the depth of ``{`` groups: 2 s at 12 levels, 40 s at 16, more as its caches grow."""

_ANSWER = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
_TRUTH = (LatexExtractionConfig(), ExprExtractionConfig())

_POWER = re.compile(r"(?<!\d)\d++(?:\s*+(?:\^|\*\*)\s*+[{(]?\s*+-?\s*+\d++)+")
"""A number to the power of a number, perhaps of a number ...: ``2^{10}``, ``9^{9^{9^9}}``,
``10**-5`` (possessive: linear in a run of digits)."""
_EAGER = re.compile(
    r"\\(?:[dt]?binom|choose|Gamma|gamma)\b.{0,40}?\d{6}|\\operatorname\s*{\s*(?:eye|zeros|ones)\s*}", re.DOTALL
)
"""What the LaTeX parser computes as it reads it: a binomial or Gamma of a literal number
(near a 6-digit one), a matrix of a given size."""
_BRACKETS = re.compile(r"[{}()\[\]]")


class _TimeoutsOff(logging.Filter):
    """math-verify warns once per process that its timeouts are off: the engine's are on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_TimeoutsOff())


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1.0 when the response's final answer equals ``ground_truth`` by math-verify, else 0.0."""
    truth = _as_latex(str(ground_truth))
    named = f"the ground truth {str(ground_truth)[:200]!r}"
    if _unreadable(truth):
        raise ValueError(
            f"{named} is not parsed: it nests brackets past {MAX_DEPTH} deep or writes a number past {MAX_BITS} bits"
        )
    gold = _parsed(truth, _TRUTH)
    if not gold:
        raise ValueError(f"math-verify reads no answer in {named}")
    if any(_too_big(g) for g in gold):
        raise ValueError(f"{named} is not compared: it may hold a number past {MAX_BITS} bits")
    if not isinstance(solution_str, str) or _unreadable(solution_str):
        return 0.0
    answer = [a for a in _parsed(solution_str, _ANSWER) if not _too_big(a)]
    return 1.0 if answer and verify(gold, answer, timeout_seconds=None) else 0.0


def _as_latex(truth: str) -> str:
    """A bare ground truth as inline LaTeX; one with math delimiters or a box as it is."""
    if "$" in truth or "\\boxed" in truth or "\\fbox" in truth:
        return truth
    return f"${truth.strip()}$"


def _parsed(text: str, config: tuple[Any, ...]) -> list[Any]:
    """math-verify's parse without its signal-based timeout: sympy objects, then the matched
    string as a fallback; ``[]`` when it finds nothing (it never raises: its errors are ``[]``)."""
    return list(parse(text, list(config), parsing_timeout=None))


def _unreadable(text: str) -> bool:
    """Whether ``text`` nests brackets deeper than :data:`MAX_DEPTH` or writes a number past
    :data:`MAX_BITS` bits: then it is not parsed."""
    return (
        _too_deep(text)
        or bool(_EAGER.search(text))
        or any(_power_bits(m.group()) > MAX_BITS for m in _POWER.finditer(text))
    )


def _too_deep(text: str) -> bool:
    if text.count("{") + text.count("(") + text.count("[") <= MAX_DEPTH:
        return False
    depth = 0
    for c in _BRACKETS.findall(text):
        depth = depth + 1 if c in "{([" else max(depth - 1, 0)
        if depth > MAX_DEPTH:
            return True
    return False


def _power_bits(tower: str) -> float:
    """An upper bound on the bits of the largest number in a tower of powers ``a^{b^{c}}``: from
    its top down, ``x ** e`` takes ``log2(x) * e`` bits."""
    bits = 0.0
    for i, number in enumerate(reversed(re.findall(r"\d+", tower))):
        digits = number.lstrip("0")
        lg = math.log2(int(digits)) if 0 < len(digits) < 300 else 3.33 * len(digits)
        bits = lg * _pow2(bits) if i and lg else lg  # 0 ** e and 1 ** e are small
        if bits > MAX_BITS:
            break
    return bits


def _too_big(expr: object) -> bool:
    """Whether an exact number in a parsed ``expr`` may take more than :data:`MAX_BITS` bits
    (math-verify's fallback strings never do)."""
    if isinstance(expr, str):
        return False
    try:
        return _bits(expr) > MAX_BITS
    except RecursionError:
        return True


_FACTORIALS = (sympy.factorial, sympy.factorial2, sympy.gamma, sympy.binomial, sympy.Product, sympy.Sum)
"""Up to n factors of up to n: a value of up to n * log2(n) bits (n, the largest number in it)."""


def _bits(expr: Any) -> float:
    """An upper bound on the bits of the exact numbers in ``expr`` and its parts, were it
    evaluated (``inf`` past a float's range): powers, exponentials and factorials are where
    sympy's exact arithmetic explodes; a symbol counts as small (it is never evaluated)."""
    if isinstance(expr, sympy.Rational):
        return float(max(int(expr.p).bit_length(), int(expr.q).bit_length()))
    if isinstance(expr, sympy.Float):  # fixed precision: only its magnitude grows what it is part of
        _, _, exponent, bit_count = expr._mpf_
        return float(max(int(exponent) + int(bit_count), 1))
    if isinstance(expr, sympy.MatrixBase):
        return max((_bits(x) for x in expr), default=0.0)
    args = getattr(expr, "args", ())
    if not isinstance(args, tuple) or not args:
        return 1.0  # a symbol, a constant (pi, E, oo)
    if isinstance(expr, sympy.Pow):
        base = _bits(expr.base)
        return _pow2(_bits(expr.exp)) * max(base, 1.0) + base
    if isinstance(expr, sympy.exp):
        return _pow2(_bits(expr.args[0])) * 2.0  # e ** x
    if isinstance(expr, _FACTORIALS):
        n = max(_bits(a) for a in args)
        return _pow2(n) * max(n, 1.0)
    parts = [_bits(a) for a in args]
    if isinstance(expr, sympy.Mul):
        return sum(parts)
    return max(parts) + math.log2(len(parts))  # a sum, a set, a tuple, a relation, a function


def _pow2(bits: float) -> float:
    """``2 ** bits``, infinite past a float's range."""
    return math.inf if bits > 1000 else 2.0**bits
