"""The docs match the code: every flag has a help line, and every command the docs show parses as written."""
import argparse
import re
import shlex
from pathlib import Path

import pytest

from blockdraft.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "blockdraft" / "weights").glob("*/README.md"))]


def parsers(parser: argparse.ArgumentParser, path: str = "blockdraft"):
    """Every (sub)parser of the command line with its command path."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, f"{path} {name}")


def test_every_flag_has_a_help_line():
    missing = [f"{path} {a.option_strings[-1]}" for path, p in parsers(build_parser()) for a in p._actions
               if a.option_strings and a.help in (None, "") and a.help is not argparse.SUPPRESS]
    assert not missing, f"flags without a help line: {missing}"


def shell_commands(text: str) -> list[str]:
    """The commands of a Markdown file's bash blocks: continuation lines joined, comments dropped, simple
    `NAME="..."` assignments of the same block expanded."""
    commands = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S):
        env: dict[str, str] = {}
        for line in re.sub(r"\s*\\\n\s*", " ", block).splitlines():
            line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
            assignment = re.fullmatch(r"([A-Z_]+)=(\"[^\"]*\"|\S+)", line)
            if assignment:
                env[assignment.group(1)] = shlex.split(assignment.group(2))[0]
            elif line:
                commands.append(re.sub(r"\$([A-Z_]+)|\$\{([A-Z_]+)\}", lambda m: env.get(m.group(1) or m.group(2),
                                                                                     m.group(0)), line))
    return commands


def blockdraft_commands() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for cmd in shell_commands(doc.read_text()):
            for part in re.split(r"\s*(?:&&|;|\||&)\s*", cmd):
                words = part.split()
                if words and words[0] in ("blockdraft", ".venv/bin/blockdraft"):
                    found.append((doc.relative_to(ROOT).as_posix(), part))
    return found


def test_the_docs_show_commands():
    docs = {d for d, _ in blockdraft_commands()}
    assert "README.md" in docs and len(blockdraft_commands()) >= 10


@pytest.mark.parametrize("doc,command", blockdraft_commands())
def test_each_documented_command_parses(doc, command, capsys):
    """Every flag and value a doc shows is one the CLI takes (argparse exits 2 on anything else)."""
    argv = shlex.split(command)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        assert e.code == 0, f"{doc}: `{command}` does not parse: {capsys.readouterr().err.strip().splitlines()[-1]}"


def test_documented_make_targets_exist():
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    for doc in DOCS:
        for cmd in shell_commands(doc.read_text()):
            words = cmd.split()
            if words[:1] == ["make"]:
                assert all(w in targets for w in words[1:] if "=" not in w), f"{doc.name}: `{cmd}`"


def test_the_extractor_sees_a_bad_flag(capsys):
    [command] = [c for c in shell_commands("```bash\nX=\"--nope 1\"\nblockdraft generate \\\n  --chat hi $X\n```\n")]
    assert command == "blockdraft generate --chat hi --nope 1"
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(shlex.split(command)[1:])
    assert e.value.code == 2
