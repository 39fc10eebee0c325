"""The verdict as tables: `tables/claims.csv` (one row per check), `tables/claims.md` (by claim, then every check)
and the HTML table the Snakemake report shows first (`results/artifact/claims.html`)."""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass

import pandas as pd

from ostinato.artifact.verdict import MET, NOT_APPLICABLE, NOT_MET, NOT_RUN, OUTCOMES, ClaimVerdict, Context
from ostinato.atomic import atomic_open
from ostinato.tables import to_markdown

COLUMNS = ["claim", "title", "check", "metric", "on", "applies", "outcome", "measured", "target", "source", "note",
           "claim_this_run", "claim_shipped"]
_COLOURS = {MET: "#1a7f37", NOT_MET: "#cf222e", NOT_APPLICABLE: "#6e7781", NOT_RUN: "#9a6700"}


@dataclass(frozen=True)
class Header:
    """What the verdict was made on: this run's machine label and kind."""

    machine: str
    kind: str

    @classmethod
    def of(cls, ctx: Context) -> Header:
        return cls(ctx.variables.get("machine", ""), ctx.kind)

    def sentence(self) -> str:
        what = ("a GPU run (the CUDA engine build): speed claims apply" if self.kind == "gpu" else
                "a CPU-only run (the CPU engine build): every expert runs on the CPU, so the speed claims do not "
                "apply here")
        return f"This run: machine `{self.machine}`, {what}."


def frame(verdicts: list[ClaimVerdict]) -> pd.DataFrame:
    """One row per check, with its claim's outcomes on this run and on the shipped data."""
    rows = []
    for v in verdicts:
        for r in v.results:
            applies = "any" if len(r.check.applies) > 1 else ", ".join(sorted(r.check.applies))
            rows.append(dict(claim=v.claim.id, title=v.claim.title, check=r.check.name, metric=r.check.metric,
                             on=r.check.on, applies=applies, outcome=r.outcome, measured=r.measured,
                             target=r.target, source=r.source, note=r.note, claim_this_run=v.run,
                             claim_shipped=v.shipped))
    return pd.DataFrame(rows, columns=COLUMNS)


def counts(df: pd.DataFrame, column: str = "outcome") -> str:
    """`met 30, not met 2, ...` over one column (every outcome named, zeros included)."""
    c = Counter(df[column])
    return ", ".join(f"{o} {c.get(o, 0)}" for o in OUTCOMES)


def _by_claim(verdicts: list[ClaimVerdict]) -> pd.DataFrame:
    return pd.DataFrame([{"claim": v.claim.id, "title": v.claim.title, "this run": v.run or "–",
                          "shipped data": v.shipped or "–",
                          "checks": ", ".join(f"{r.check.name} {r.outcome}" for r in v.results)}
                         for v in verdicts])


def markdown(verdicts: list[ClaimVerdict], header: Header) -> str:
    """tables/claims.md: the outcome of each claim, then every check with its numbers."""
    df = frame(verdicts)
    claims = _by_claim(verdicts)
    checks = df[["check", "metric", "on", "applies", "outcome", "measured", "target", "source", "note"]]
    return "\n".join([
        "# Verdict of the claims", "",
        f"{header.sentence()} Written by `ostinato artifact check` from `artifact/claims.yaml` (ARTIFACT.md says "
        "what each claim means). A claim's outcome is `not met` if one of its checks is, else `not run` if one is, "
        "else `met` if one is, else `not applicable here`; `this run` reads this run's results/ and tables/, "
        "`shipped data` the reference runs in data/reference/ and the paper's numbers in data/paper/.", "",
        f"Checks: {counts(df)}. Claims on this run: {counts(claims, 'this run')}.", "",
        "## By claim", "", to_markdown(claims),
        "## Every check", "", to_markdown(checks)])


def _cell(text: str) -> str:
    return html.escape(str(text)) if str(text) != "nan" else ""


def _badge(outcome: str) -> str:
    if not outcome or outcome == "–":
        return "–"
    return (f'<span class="ov" style="background:{_COLOURS[outcome]}">{html.escape(outcome)}</span>')


def html_table(verdicts: list[ClaimVerdict], header: Header) -> str:
    """The verdict as an HTML fragment for the report's first page: one row per claim, its checks nested."""
    df = frame(verdicts)
    rows = []
    for v in verdicts:
        checks = "".join(
            f"<tr><td>{_cell(r.check.name)}</td><td>{_cell(r.check.metric)}</td><td>{_cell(r.check.on)}</td>"
            f"<td>{_badge(r.outcome)}</td><td>{_cell(r.measured)}</td><td>{_cell(r.target)}</td>"
            f'<td><span class="src">{_cell(r.source)}</span></td><td>{_cell(r.note)}</td></tr>' for r in v.results)
        rows.append(
            f'<tr class="claim"><td><b>{_cell(v.claim.id)}</b></td><td colspan="2">{_cell(v.claim.title)}</td>'
            f"<td>{_badge(v.run)}</td><td colspan=\"4\">shipped data: {_badge(v.shipped)}</td></tr>{checks}")
    # the report's first page: its text column as wide as the page, its content pane from the top (Snakemake
    # centres it, which puts the top of a long page out of reach)
    style = ("<style>div.prose.max-w-lg{max-width:none}div.grow.flex.items-center.h-screen{align-items:flex-start}"
             "table.ostinato-verdict{border-collapse:collapse;font-size:12px}table.ostinato-verdict td,"
             "table.ostinato-verdict th{border:1px solid #d0d7de;padding:2px 6px;vertical-align:top}"
             "table.ostinato-verdict tr.claim td{background:#f6f8fa}span.src{font-family:monospace;font-size:11px}"
             "span.ov{color:#fff;border-radius:4px;padding:0 6px;white-space:nowrap}</style>")
    return "\n".join([
        style,
        f"<p>{html.escape(header.sentence())} Checks: {html.escape(counts(df))}.</p>",
        '<table class="ostinato-verdict"><thead><tr><th>check</th><th>what</th><th>on</th><th>outcome</th>'
        "<th>measured</th><th>target</th><th>source</th><th>note</th></tr></thead><tbody>",
        *rows, "</tbody></table>", ""])


def write(verdicts: list[ClaimVerdict], header: Header, csv: str | None, md: str | None,
          html_path: str | None) -> None:
    """Write the tables that are asked for (atomically)."""
    if csv:
        with atomic_open(csv) as fh:
            frame(verdicts).to_csv(fh, index=False)
    for path, text in ((md, markdown(verdicts, header) if md else ""),
                       (html_path, html_table(verdicts, header) if html_path else "")):
        if path:
            with atomic_open(path) as fh:
                fh.write(text)
