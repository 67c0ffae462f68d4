"""The README and docs/ are what a newcomer follows: a link to a file that moved, an anchor to a
section that was renamed, or a command naming a script that is gone sends them nowhere."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a '# comment' in code is no heading
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_slug_follows_githubs_rule():
    assert slug("API (OpenAI-compatible, on the same server as the page)") == \
        "api-openai-compatible-on-the-same-server-as-the-page"
    assert slug("Before: lookup + datastore, 7,227 answers") == "before-lookup--datastore-7227-answers"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_and_anchor_in_the_docs_resolves(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_script_the_docs_name_exists(doc):
    named = set(re.findall(r"\bscripts/[\w.-]+\.(?:py|sh)\b", doc.read_text()))
    assert named, f"{doc.name} names no script: this test reads the wrong file"
    assert sorted(s for s in named if not (ROOT / s).is_file()) == []


def test_the_readme_leads_to_the_measurement_log():
    readme = (ROOT / "README.md").read_text()
    assert "](docs/MEASUREMENTS.md" in readme
    assert (ROOT / "docs" / "MEASUREMENTS.md").stat().st_size > 0


def _two_commands() -> tuple[str, str]:
    """The README's two commands, from the fenced blocks of its *Two commands* section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    blocks = [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]
    assert len(blocks) == 2, blocks
    return blocks[0], blocks[1]


def test_ci_runs_the_readmes_test_command_verbatim():
    start, tests = _two_commands()
    assert "app.py" in start and "pytest" in tests
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if ln.strip() and not ln.lstrip().startswith("#")]
    assert tests in ci, f".ci/run does not run the README's test command {tests!r}: {ci}"


def test_set_up_installs_into_the_python_the_readme_runs():
    """The README runs `python ...`; set-up must install into that interpreter, not another one
    that happens to be called python3."""
    start, tests = _two_commands()
    assert re.search(r"\bpython -m pytest\b", tests) and re.search(r"\bpython app\.py\b", start)
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    default = re.search(r"^PY=(.+)$", setup, flags=re.M).group(1)
    assert "command -v python " in default and default.index("python ") < default.index("python3"), default
