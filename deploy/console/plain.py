"""Text that came from a host or a payload, made harmless for a terminal.

A payload's log line, an event's keys, a host's answer can hold anything: escape sequences
that move the cursor, clear the screen, retitle the window or write to the clipboard; other
control characters; and brackets that rich would read as markup. What the console prints of
them is plain text:
- every C0 control character but TAB and LF, DEL, and every C1 control (U+0080 to U+009F)
  is shown as a visible escape, `\\x1b` for ESC: a sequence reads as what it is and does
  nothing;
- a CR inside a line shows only what follows the last one, as a terminal shows the line
  redrawn (a progress bar's updates), without the cursor ever moving; CRs ending a line
  (CRLF) are dropped;
- markup is never interpreted: callers print the result as a rich Text (or with
  markup=False), never as a markup string.
The log files keep the raw bytes; this is only what reaches the screen.
"""
from __future__ import annotations

KEPT = {"\t", "\n"}
ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))
           if chr(code) not in KEPT and code != 0x0D}


def plain(text: str) -> str:
    """`text` with every control character neutralised (the module's rules)."""
    if "\r" in text:
        text = "\n".join(line.rstrip("\r").rpartition("\r")[2] for line in text.split("\n"))
    return text.translate(ESCAPES)
