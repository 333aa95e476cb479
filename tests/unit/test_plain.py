"""Text from payloads and hosts reaches the terminal as plain text: escape sequences and
control characters neutralised, brackets never read as rich markup."""
from __future__ import annotations

import io
import json

from rich.console import Console

from deploy.console.lines import shown_line
from deploy.console.plain import plain
from deploy.console.view import failure_panel, print_lines, say, status_table, summary_table
from deploy.state.progress import TaskProgress

# What a hostile or careless payload prints: a window title (OSC ... BEL), clear screen
# (CSI), a C1 CSI, a backspace, DEL, a NUL, and rich markup.
NASTY = "a\x1b]0;title\x07b \x1b[2J c\x9b31m d\x08\x7f\x00 [/bold] [red]x[/red]"
NEUTRAL = r"a\x1b]0;title\x07b \x1b[2J c\x9b31m d\x08\x7f\x00 [/bold] [red]x[/red]"


def control_characters(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) < 0xA0]


def test_every_control_character_but_tab_and_newline_becomes_a_visible_escape():
    assert plain(NASTY) == NEUTRAL
    every = "".join(map(chr, range(0xA0)))
    assert control_characters(plain(every)) == []
    assert plain("\tcol\ttab\nnext") == "\tcol\ttab\nnext"
    assert plain("naïve ünïcode ✓ █") == "naïve ünïcode ✓ █"


def test_a_carriage_return_shows_the_line_as_a_terminal_redraws_it():
    assert plain("10%\r50%\r100%") == "100%"
    assert plain("done\r") == "done"                  # CRLF's CR
    assert plain("a\rb\nc\r\nd") == "b\nc\nd"
    assert "\r" not in plain("x\r\r\ry\r")


def test_log_lines_are_plain_in_every_view_and_raw_too():
    assert shown_line(NASTY) == NEUTRAL
    assert shown_line(NASTY, raw=True) == NEUTRAL
    event = json.dumps({"event": "epoch", "epoch": 1, "loss": 0.5, "\x1b[2J[/b]": 1.0})
    assert shown_line(event) == r"epoch 1  loss 0.5000  \x1b[2J[/b] 1.0000"


def test_a_markup_looking_line_prints_as_written_without_escape_bytes():
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    task = TaskProgress(0, "h1")
    print_lines(console, task, [NASTY, "[/bold]", "[bold]not bold[/]"])
    assert out.getvalue() == (f"[worker-0 h1] {NEUTRAL}\n"
                              "[worker-0 h1] [/bold]\n"
                              "[worker-0 h1] [bold]not bold[/]\n")
    say(console, "host said: \x1b[31m[/red]")
    assert out.getvalue().endswith("host said: \\x1b[31m[/red]\n")


def test_the_panels_and_tables_show_a_payloads_values_as_plain_text():
    """A payload's epoch value and metric names are its own: shown, never interpreted."""
    task = TaskProgress(0, "h1")
    task.replay(b"\x1b]52;c;ZXZpbA==\x07 [/bold]\n" + json.dumps(
        {"event": "epoch", "epoch": "[/bold]\x1b[2J", "loss": 1.0, "[/i]\x07": 2.0}).encode()
        + b"\n")
    task.state, task.code, task.pid = "exited", 1, "[/x]\x1b"
    for renderable in (failure_panel(task, "exit [/code]\x1b]0;t\x07"),
                       status_table([task], "run"),
                       summary_table([task])):
        out = io.StringIO()
        Console(file=out, width=200, force_terminal=True).print(renderable)
        text = out.getvalue()
        # Rich's own styling uses CSI "ESC [ ... m"; nothing else of the payload's gets out.
        assert "\x1b]" not in text and "\x07" not in text and "\x1b[2J" not in text
        assert "[/" in text
