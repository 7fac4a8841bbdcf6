"""Write docs/knobs.md, the knobs reference, from the knob table (hpclab/core/knobs.py).

    python scripts/knobs_doc.py          # rewrite docs/knobs.md
    python scripts/knobs_doc.py --check  # exit 1 if docs/knobs.md is not what the table says

tests/test_knobs.py checks that the committed page is what this script writes now, so a knob
changed in the table and not here fails the fast tests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "knobs.md"
sys.path.insert(0, str(ROOT))

from hpclab.core.knobs import SECTIONS, Knob, by_section  # noqa: E402

HEADER = """\
# Knobs reference

Every knob of a training run: its section, default, the values it accepts and what it does.
Generated from the knob table, `hpclab/core/knobs.py`, by `scripts/knobs_doc.py`; edit the
table, then run the script (a fast test fails when this page and the table differ).

A knob is one flat name everywhere: `RunConfig(batch_per_worker=128)` in a notebook,
`--batch-per-worker 128` on the command line (`hpclab run --help` lists the options in these
sections), `"batch_per_worker": 128` in a run's record. `cfg.section("straggler")` reads one
section's values. A value outside what a knob accepts is refused before any engine starts, in
one sentence naming the knob, the value and what is allowed; the rules between knobs (for
example `groups` must divide the workers with `update="hybrid"`) live in
`hpclab/core/config_rules.py`.
"""


def _default(knob: Knob) -> str:
    d = knob.default
    if knob.kind == "shape":
        return "`" + ",".join(map(str, d)) + "`"
    if knob.kind == "tags":
        return "none" if not d else "`" + ",".join(d) + "`"
    if knob.kind in ("choice", "text"):
        return f"`{d!r}`"
    return f"`{d:g}`" if isinstance(d, float) else f"`{d}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The whole page, from the table."""
    lines = [HEADER]
    for section, rows in by_section().items():
        lines += [
            f"## {section}",
            "",
            SECTIONS[section][0].upper() + SECTIONS[section][1:] + ".",
            "",
        ]
        lines += ["| knob | option | default | accepts | what it does |", "|---|---|---|---|---|"]
        for k in rows:
            cells = (f"`{k.name}`", f"`{k.option}`", _default(k), k.allowed(), k.help)
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = PAGE.exists() and PAGE.read_text(encoding="utf-8") == text
        print("docs/knobs.md is up to date" if same else "docs/knobs.md differs: run the script")
        return 0 if same else 1
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
