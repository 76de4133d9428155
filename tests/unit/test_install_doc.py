"""docs/install.md is README's install section, generated (scripts/install_doc.py; `make docs`)."""

from __future__ import annotations

import subprocess
import sys

from kit.api import REPO


def test_docs_install_is_generated_from_the_readme() -> None:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "install_doc.py"), "--check"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_the_generated_document_keeps_the_sections_and_fixes_links() -> None:
    text = (REPO / "docs" / "install.md").read_text()
    assert text.splitlines()[2] == "# Install on a cluster"
    assert "### Prerequisites" not in text and "## Prerequisites" in text
    assert "](examples/" not in text and "](charts/" not in text
