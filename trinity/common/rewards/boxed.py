"""``math_boxed_reward``: the response's last ``\\boxed{}`` answer against the truth.

The original Trinity-RFT's boxed-answer reward (``math_boxed_workflow``'s default), in the
lm-evaluation-harness MATH style: ``accuracy`` is 1.0 when the content of the response's last
``\\boxed{...}`` (or ``\\boxed x``, ``\\fbox{...}``) equals the truth after the LaTeX
normalisation of ``normalise_latex``, else 0.0 (no box: 0.0). A truth holding a box is read
the same way; otherwise it is the answer as written. ``format_score`` is 0.0, or
``-format_score_coef`` when the workflow asks for thinking (``with_think``) and the response
does not hold exactly one ``<think>`` before exactly one ``</think>``: the two call arguments
come from ``math_boxed_workflow``'s ``workflow_args``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional

from trinity.common.rewards.base import REWARD_FUNCTIONS, RewardFn

_BOX_OPENERS = ("\\boxed", "\\fbox")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm)\{([^{}]*)\}")
_UNITS = re.compile(r"\\(?:text|mbox)\{\s[^{}]*\}")  # "5\text{ cm}": a unit after a value
_VARIABLE = re.compile(r"^[a-zA-Z]\s*=\s*")  # "x = 5" answers 5
_TRAILING_ZEROS = re.compile(r"(\d)\.0+(?=\D|$)")  # 72.0 -> 72
_SQRT_SHORT = re.compile(r"\\sqrt(\w)")  # \sqrt2 -> \sqrt{2}
_FRAC_SHORT = re.compile(r"\\frac(\w)(\w)")  # \frac12 -> \frac{1}{2}
_INT_SLASH = re.compile(r"^(-?\d+)/(\d+)$")  # 1/2 -> \frac{1}{2}
_DROPPED = ("\\!", "\\$", "$", "\\%", "%", "\\left", "\\right", "^{\\circ}", "^\\circ", "\n")


def last_boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}``/``\\fbox{...}`` (or ``\\boxed x``) in
    ``text``, None when there is none or its braces never close."""
    start = max(text.rfind(opener) for opener in _BOX_OPENERS)
    if start < 0:
        return None
    rest = text[start:]
    opener = next(o for o in _BOX_OPENERS if rest.startswith(o))
    body = rest[len(opener) :]
    if body.startswith(" "):  # "\boxed 5$": up to the closing dollar
        return body[1:].split("$")[0].strip()
    if not body.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(body):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return body[1:i]
    return None


def normalise_latex(answer: str) -> str:
    """``answer`` in one canonical spelling: dollars, ``\\!``, percent signs, ``\\left``/
    ``\\right``, degrees, unit texts, a leading ``x =``, spaces and a final period dropped;
    ``\\dfrac``/``\\tfrac`` as ``\\frac``; ``\\text{a}`` as ``a``; ``72.0`` as ``72``;
    ``.5`` as ``0.5``; ``\\sqrt2``, ``\\frac12`` and ``1/2`` with braces; one pair of
    enclosing braces or parentheses removed."""
    s = answer.strip().rstrip(".")
    for dropped in _DROPPED:
        s = s.replace(dropped, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _UNITS.sub("", s)
    s = _TEXT.sub(r"\1", s)
    s = _VARIABLE.sub("", s.strip())
    s = _TRAILING_ZEROS.sub(r"\1", s)
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    s = "0" + s if s.startswith(".") else s
    s = s.replace(" ", "")
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _INT_SLASH.sub(r"\\frac{\1}{\2}", s)
    if len(s) > 1 and (s[0], s[-1]) in (("{", "}"), ("(", ")")):
        s = s[1:-1]
    return s


def boxed_answer_correct(response: str, truth: Optional[str]) -> bool:
    """The response's last boxed answer equals the truth (its own boxed answer when it has
    one), both normalised by ``normalise_latex``."""
    answer = last_boxed(response)
    if answer is None or truth is None:
        return False
    reference = last_boxed(truth)
    reference = truth if reference is None else reference
    return normalise_latex(answer) == normalise_latex(reference)


def thinks_once(response: str) -> bool:
    """Exactly one ``<think>`` and one ``</think>``, in that order."""
    if response.count("<think>") != 1 or response.count("</think>") != 1:
        return False
    return response.index("<think>") < response.index("</think>")


@REWARD_FUNCTIONS.register_module("math_boxed_reward")
class MathBoxedReward(RewardFn):
    """``accuracy``: the last boxed answer is the truth; ``format_score``: minus
    ``format_score_coef`` when ``with_think`` asks for one think block and there is none."""

    def __call__(
        self,
        response: str,
        truth: Optional[str] = None,
        with_think: bool = False,
        format_score_coef: float = 0.1,
        **kwargs: Any,
    ) -> Dict[str, float]:
        accuracy = float(boxed_answer_correct(response, truth))
        penalty = -format_score_coef if with_think and not thinks_once(response) else 0.0
        return {"accuracy": accuracy, "format_score": penalty}
