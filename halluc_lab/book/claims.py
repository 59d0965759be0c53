"""Check the claim: recompute a document's worked example and show it beside the stated value.

Every chapter recomputes each worked example and numeric claim of the documents it
covers (ARCHITECTURE.md §6). A :class:`ClaimTable` collects them and renders a small table
(quantity | document | computed | agrees); disagreements are then recorded on the
errata page. The cells that build these tables are compared with the committed
outputs by nbval, so the rendering is deterministic: numbers are printed with a
fixed number of significant digits and nothing depends on the device or the scale::

    t = ClaimTable("001 Part 3 §4 — temperature worked example")
    t.check("p(cat) at τ = 1", stated=0.66, computed=0.6590, tol=0.005)
    t   # renders the table; t.n_disagreements == 0
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from numbers import Real


@dataclass(frozen=True)
class Claim:
    """One checked statement of a document."""

    quantity: str  # what is claimed, in words ("p(cat) at τ = 1")
    stated: object  # the document's value (a number or a phrase)
    computed: object  # what the lab computed
    agrees: bool  # within tolerance, or judged to agree
    note: str = ""  # why it disagrees, or how it was checked


def _fmt(value: object, digits: int) -> str:
    """A deterministic short rendering: numbers to `digits` significant digits."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, Real):
        value = float(value)
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value == int(value) and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_fmt(v, digits) for v in value) + ")"
    return str(value)


_CODE = re.compile(r"`([^`]+)`")  # a `span` in a quantity, value or note: code, as in Markdown


def _cell(text: str) -> str:
    """A cell's text as HTML: escaped, and each `span` shown as code (the table is HTML, where
    Markdown's backticks would print as they are)."""
    return _CODE.sub(r"<code>\1</code>", html.escape(text))


# What a claim about a difference's sign needs of its interval (ClaimTable.check_sign).
_SIDES = {"< 0": lambda d: d.high < 0, "> 0": lambda d: d.low > 0,
          "≠ 0": lambda d: d.low > 0 or d.high < 0}


class ClaimTable:
    """A titled list of claims checked against computed values; displays as a table."""

    def __init__(self, title: str, digits: int = 4):
        if not isinstance(title, str) or not title:
            raise ValueError("title must be a non-empty string naming the document and section")
        if not isinstance(digits, int) or not 1 <= digits <= 12:
            raise ValueError(f"digits must be an int in [1, 12], got {digits!r}")
        self.title = title
        self.digits = digits
        self.claims: list[Claim] = []

    def check(self, quantity: str, *, stated, computed, tol: float | None = None,
              rel: float | None = None, agrees: bool | None = None, note: str = "") -> bool:
        """Record one claim and return whether it agrees.

        Numbers agree when ``|computed - stated| <= tol`` (absolute, e.g. the document's
        rounding) or ``<= rel * |stated|``. Anything else needs an explicit ``agrees``.
        """
        if agrees is None:
            if tol is None and rel is None:
                raise ValueError(f"{quantity!r}: give tol= or rel= for a numeric claim, or agrees=")
            if not isinstance(stated, Real) or not isinstance(computed, Real):
                raise TypeError(f"{quantity!r}: tol/rel need numeric stated and computed values, "
                                f"got {type(stated).__name__} and {type(computed).__name__}")
            for name, bound in (("tol", tol), ("rel", rel)):
                if bound is not None and not (isinstance(bound, Real) and bound >= 0):
                    raise ValueError(f"{name} must be a non-negative number, got {bound!r}")
            if not math.isfinite(float(computed)):
                agrees = False
            else:
                diff = abs(float(computed) - float(stated))
                agrees = (tol is not None and diff <= tol) or (
                    rel is not None and diff <= rel * abs(float(stated)))
        self.claims.append(Claim(quantity, stated, computed, bool(agrees), note))
        return bool(agrees)

    def check_sign(self, quantity: str, difference, *, stated: str, note: str = "") -> bool:
        """Record a claim about the sign of a difference of arms (a ``stats.Interval``) and
        return whether it agrees: ``stated`` is "< 0", "> 0" or "≠ 0", and the claim agrees only
        where the whole interval lies on that side ("not resolved" is not agreement). The computed
        column is the difference with its interval, signed, to three decimals."""
        if stated not in _SIDES:
            raise ValueError(f"stated must be one of {sorted(_SIDES)}, got {stated!r}")
        return self.check(quantity, stated=stated, computed=format(difference, "+.3f"),
                          agrees=_SIDES[stated](difference), note=note)

    @property
    def n_disagreements(self) -> int:
        """How many claims disagree."""
        return sum(not c.agrees for c in self.claims)

    @property
    def disagreements(self) -> list[Claim]:
        """The claims that disagree."""
        return [c for c in self.claims if not c.agrees]

    def _rows(self) -> list[tuple[str, str, str, str, str]]:
        return [(c.quantity, _fmt(c.stated, self.digits), _fmt(c.computed, self.digits),
                 "✓" if c.agrees else "✗", c.note) for c in self.claims]

    def __repr__(self) -> str:
        rows = [("quantity", "document", "computed", "agrees", "note"), *self._rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [self.title, *("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
                               for r in rows)]
        lines.append(f"{len(self.claims) - self.n_disagreements} of {len(self.claims)} agree")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>"
                       for h in ("quantity", "document", "computed", "agrees", "note"))
        mark = {"✓": '<td style="color:#1a7f37">✓</td>',
                "✗": '<td style="color:#cf222e;font-weight:bold">✗</td>'}
        body = "".join(
            f'<tr class="{"claim-ok" if ok == "✓" else "claim-bad"}">'
            + "".join(f"<td>{_cell(cell)}</td>" for cell in (q, s, c)) + mark[ok]
            + f"<td>{_cell(n)}</td></tr>"
            for q, s, c, ok, n in self._rows())
        summary = f"{len(self.claims) - self.n_disagreements} of {len(self.claims)} agree"
        return (f'<table class="claim-table"><caption>{_cell(self.title)} — {summary}</caption>'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def resid(x) -> float:
    """A residual rounded to 1e-12, so checked outputs read the same on every machine."""
    return round(float(x), 12)
