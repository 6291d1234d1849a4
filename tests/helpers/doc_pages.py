"""The command lines of README.md and docs/*.md, read from the pages' fenced code blocks (tests/cli/test_doc_runs.py
runs them; tests/cli/test_docs.py composes the vit-train ones).

A command line starts with a program this project documents (PROGRAMS; after a `$ ` prompt, `VAR=value`
assignments and `cd DIR &&`); `\\` continues it; a line under it that starts with `PROG: error: ` (or Hydra's
`In 'train': `) is the refusal it must end with. Other lines (what a command printed, a script's shell statements)
are not commands. A ```python block is Python, not command lines. The line before a block's fence (blank lines
aside) may say `<!-- needs: WHAT -->`: the block needs what this machine lacks (a GPU, a cluster, the network),
with the reason; or `<!-- run by: tests/FILE.py::TEST -->`: that test runs the block's command as shown (a
3-minute run the slow suite should not make twice).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
NEEDS = re.compile(r"<!--\s*needs:\s*(.*?)\s*-->")
RUN_BY = re.compile(r"<!--\s*run by:\s*(\S+?)::(\w+)\s*-->")
# The first word of a command line (python's: with what follows it), as the pages write them.
PROGRAMS = ("vit-train", "vit-eval", "vit-predict", "vit-export", "vit-shards", "vit-sweep-summary", "torchrun",
            "srun", "pip", "pytest", "ruff", "mypy", "python", "python3", "cd")
REFUSAL = re.compile(r"^(?:[\w-]+: error: |In 'train': )")
ASSIGNMENT = re.compile(r"^\w+=")


@dataclass
class Command:
    """One command line: `argv` is its words (shlex's; `VAR=value` prefixes in `env`), `error` the refusal line
    shown under it (or None: it must succeed)."""

    line: int
    source: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @property
    def program(self) -> str:
        """vit-train for `python -m vit_train`, `script NAME` for `python scripts/NAME.py`, else the first word."""
        first = self.argv[0]
        if first in ("python", "python3") and len(self.argv) > 1:
            if self.argv[1:3] == ["-m", "vit_train"]:
                return "vit-train"
            if self.argv[1] == "-m":
                return f"python -m {self.argv[2]}"
            if self.argv[1].startswith("scripts/"):
                return f"script {Path(self.argv[1]).name}"
        return first


@dataclass
class Block:
    page: str
    line: int  # the fence's line, 1-based
    needs: str | None
    commands: list[Command]
    run_by: tuple[str, str] | None = None  # (test file, test name)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands_of(body: str, first_line: int) -> list[Command]:
    """The command lines of one block's text (its first line at `first_line`)."""
    lines = body.split("\n")
    found: list[Command] = []
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        line = re.sub(r"^\s*\$ ", "", line).strip()
        if not line or line.startswith("#") or REFUSAL.match(line):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # not shell: what a command printed
            continue
        env = {}
        while words and ASSIGNMENT.match(words[0]) and len(words) > 1:
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if not words or words[0] not in PROGRAMS:
            continue
        shown = lines[i].strip() if i < len(lines) else ""
        found.append(Command(first_line + start, line, words, env, shown if REFUSAL.match(shown) else None))
    return found


def doc_blocks() -> list[Block]:
    """Every fenced block of the pages with at least one command line, in page order."""
    blocks = []
    for page in doc_pages():
        text = page.read_text()
        lines = text.split("\n")
        for block in FENCE.finditer(text):
            if block.group(1).strip() == "python":
                continue
            fence = text.count("\n", 0, block.start()) + 1
            commands = commands_of(block.group(2), fence + 1)
            if not commands:
                continue
            before = next((lines[k] for k in range(fence - 2, -1, -1) if lines[k].strip()), "")
            needs, run_by = NEEDS.search(before), RUN_BY.search(before)
            blocks.append(Block(str(page.relative_to(ROOT)), fence, needs.group(1) if needs else None, commands,
                                run_by.groups() if run_by else None))
    return blocks


def steps(command: Command) -> list[list[str]]:
    """A command line's simple commands in order (`a && b`: a, then b)."""
    parts: list[list[str]] = [[]]
    for word in command.argv:
        if word in ("&&", ";"):
            parts.append([])
        else:
            parts[-1].append(word)
    return [p for p in parts if p]
