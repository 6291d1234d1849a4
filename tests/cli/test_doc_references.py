"""The docs and config comments point at files that exist, and docs/configs.md lists every option.

A file is cited by a Markdown link (relative to its page), by a path that starts with one of the
repository's top-level folders (`docs/...`, `configs/...`, `vit_train/...`, `tests/...`, `scripts/...`),
or by a top-level document's name in capitals (`README.md`, `REFERENCES.md`). A name written after
another repository (`facebookresearch/mae FINETUNE.md`, `google-research/big_vision configs/x.py`) is
that repository's file, and so is that name elsewhere. The recipe headers once cited a REFERENCES.md
that was never in the repository (now docs/references.md) and a vit_train/config.py that had moved.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("docs", "configs", "vit_train", "tests", "scripts", ".ci")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*<>-]*[\w*>/]|[A-Z][A-Z_]+\.md)" % "|".join(map(re.escape, FOLDERS)))
OTHER_REPO = re.compile(r"(?<![\w./-])[A-Za-z][\w.-]*/[A-Za-z][\w.-]*(?:'s)?[ ,:]+"
                        r"((?:[\w-]+/)*[A-Za-z][\w.-]*\.(?:md|py|yaml|yml|json|txt|sh|toml|cfg))\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def citing_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "configs").rglob("*.yaml"))]


def other_repositories_files(texts: list[str]) -> set[str]:
    """Names written right after another repository's owner/name (not one of this repository's paths)."""
    names = set()
    for text in texts:
        for match in OTHER_REPO.finditer(text):
            if not match.group(0).startswith(tuple(f"{f}/" for f in FOLDERS)):
                names.add(match.group(1))
    return names


def citations(path: Path, text: str, others: set[str]) -> list[tuple[int, str, Path]]:
    """(line, as written, where it must be) for each file `text` (of `path`) cites."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line) if path.suffix == ".md" else []:
            target = target.split("#")[0]
            if target and not re.match(r"^[a-z]+:", target):  # not a URL, not an anchor on the page
                found.append((number, target, path.parent / target))
        for match in PATH.finditer(line):
            if line[:match.start()].endswith("]("):  # a link's target, checked above
                continue
            cited = match.group(1).rstrip("/.")
            if cited in others or any(cited.endswith("/" + name) or cited == name for name in others):
                continue
            found.append((number, cited, ROOT / cited))
    return found


def exists(target: Path) -> bool:
    if "<" in str(target):  # a placeholder (configs/experiment/<name>.yaml): its folder
        target = Path(str(target).split("<")[0])
    if "*" in str(target):
        return any(ROOT.glob(str(target.relative_to(ROOT)))) if target.is_relative_to(ROOT) else False
    return target.exists()


def all_citations() -> list:
    texts = {path: path.read_text() for path in citing_files()}
    others = other_repositories_files(list(texts.values()))
    return [pytest.param(cited, target, id=f"{path.relative_to(ROOT)}:{line}:{cited}")
            for path, text in texts.items() for line, cited, target in citations(path, text, others)]


CITATIONS = all_citations()


def test_the_docs_and_configs_cite_files():
    cited = {param.values[0] for param in CITATIONS}
    assert len(CITATIONS) >= 50 and "docs/references.md" in cited and "vit_train/schema/sections.py" in cited


@pytest.mark.parametrize("cited, target", CITATIONS)
def test_every_cited_file_exists(cited, target):
    assert exists(target), f"{cited} is cited but is not in the repository"


def test_the_check_finds_a_missing_file_and_skips_other_repositories():
    text = ("# expected: 93.58% (see REFERENCES.md); the schema (vit_train/config.py, TrainerConfig)\n"
            "# recipe: facebookresearch/mae FINETUNE.md, google-research/big_vision configs/vit_s16_i1k.py\n"
            "# then docs/mae.md and configs/experiment/*.yaml and configs/experiment/<name>.yaml\n"
            "per its FINETUNE.md; see [speed](docs/speed.md) and [gone](docs/gone.md#part) or [web](https://x.org/a.md)\n")
    others = other_repositories_files([text])
    assert others == {"FINETUNE.md", "configs/vit_s16_i1k.py"}
    found = [(cited, exists(target)) for _, cited, target in citations(ROOT / "README.md", text, others)]
    assert found == [("REFERENCES.md", False), ("vit_train/config.py", False), ("docs/mae.md", True),
                     ("configs/experiment/*.yaml", True), ("configs/experiment/<name>.yaml", True),
                     ("docs/speed.md", True), ("docs/gone.md", False)]


# --- docs/configs.md lists every option ----------------------------------------------------------

def listed_options() -> dict[str, set[str]]:
    """docs/configs.md's group table: {group: the options its second column names in backticks}."""
    text = (ROOT / "docs" / "configs.md").read_text()
    table = text[text.index("| group | options |"):].split("\n\n")[0]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    return {row[0].strip("| `"): {name for names in re.findall(r"`([^`]+)`", row[1])
                                  for name in names.strip("[]").split(",") if name}  # a list group's: `[a,b]`
            for row in rows}


def option_files() -> dict[str, set[str]]:
    """configs/: {group folder: its option files' names}, nested groups (hydra/launcher) included."""
    groups: dict[str, set[str]] = {}
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        if path.parent != ROOT / "configs":  # train.yaml is the root, not an option
            groups.setdefault(path.parent.relative_to(ROOT / "configs").as_posix(), set()).add(path.stem)
    return groups


def test_docs_configs_md_lists_every_option_file_and_no_other():
    assert listed_options() == option_files()
