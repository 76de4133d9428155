"""docs/install.md is generated from README.md's "Install on a cluster" section: one source, two places.

    python scripts/install_doc.py          # write docs/install.md (make docs)
    python scripts/install_doc.py --check  # exit 1 if docs/install.md is stale (tests/unit/test_install_doc.py)

Edit README.md, never docs/install.md. Headings move up one level (the section is the document's title) and
relative links are rewritten for docs/.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TARGET = ROOT / "docs" / "install.md"
SECTION = "## Install on a cluster"
HEADER = ("<!-- Generated from README.md (section \"Install on a cluster\") by `make docs`: edit README.md, "
          "not this file. -->\n\n")


def render(readme: str) -> str:
    """The README section as a document of its own."""
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    section = readme[start:] if end < 0 else readme[start:end + 1]
    section = re.sub(r"^#(#+) ", r"\1 ", section, flags=re.M)  # "## Install" -> "# Install"
    section = re.sub(r"\]\((?!https?:|#|/)([^)]+)\)", r"](../\1)", section)
    return HEADER + section.rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/install.md is stale")
    args = parser.parse_args(argv)
    text = render(README.read_text())
    if args.check:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run `make docs`", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
