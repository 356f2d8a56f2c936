"""Every command's --help as a user reads it: brackets printed as written, paragraphs
reflowed (no docstring line break left mid-sentence), flags without a type."""

import pytest
import typer
from typer.testing import CliRunner

from trinity.cli.main import app

COMMANDS = sorted(typer.main.get_command(app).commands)


def help_text(args, width=None):
    extra = {} if width is None else {"terminal_width": width, "max_content_width": width}
    result = CliRunner().invoke(app, [*args, "--help"], **extra)
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_is_checked():
    assert {"run", "prepare-quickstart", "view", "debug", "studio"} <= set(COMMANDS)


def test_brackets_are_printed_as_written():
    assert 'pip install -e ".[smollm2]"' in help_text(["prepare-quickstart"], width=1000)


@pytest.mark.parametrize("args", [[], *([c] for c in COMMANDS)])
def test_no_sentence_is_broken_and_no_flag_is_typed(args):
    """On a line wide enough for any paragraph each one is a line of its own: a line that
    stops without ending its sentence (. : ) ]) was cut by a line break of the source."""
    wide = help_text(args, width=1000)
    for line in wide.splitlines():
        text = line.strip()
        if text and not text.startswith("Usage:"):
            assert text[-1] in ".:)]", f"{args}: a line ends mid-sentence: {line!r}"
    for text in (wide, help_text(args)):
        assert "<bool>" not in text and "BOOLEAN" not in text


def test_at_80_columns_the_commands_list_cuts_no_summary():
    listing = help_text([], width=80).split("Commands:")[1]
    assert listing.strip() and "..." not in listing
