"""runs/<id>/loss.png: every task's loss per epoch (and validation loss where the payload
reports it), drawn with matplotlib's Agg backend, which needs no display."""
from __future__ import annotations

from pathlib import Path

from deploy.console.view import task_style
from deploy.state.progress import TaskProgress

# rich's colour names that matplotlib does not know, as matplotlib colours.
MPL_COLOURS = {"bright_red": "red", "bright_cyan": "darkturquoise",
               "bright_magenta": "orchid", "bright_green": "limegreen",
               "bright_yellow": "gold", "yellow": "goldenrod", "green": "tab:green",
               "cyan": "tab:cyan", "magenta": "m", "blue": "tab:blue"}


def plot_losses(tasks: list[TaskProgress], path: Path, title: str) -> bool:
    """Draw the tasks' losses into `path` (PNG); False, and nothing written, when no task
    reported a loss."""
    if not any(t.losses for t in tasks):
        return False
    # Imported here: matplotlib takes a while to import, and only the end of a run draws.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for order, task in enumerate(tasks):
        colour = MPL_COLOURS[task_style(task.index)]
        # Synchronous workers report the same losses: earlier tasks are drawn wider, so
        # that every curve stays visible where they overlap.
        width = 1.2 + 2.5 * (len(tasks) - 1 - order) / max(1, len(tasks) - 1)
        if task.losses:
            axes.plot(range(1, len(task.losses) + 1), task.losses, color=colour,
                      linewidth=width, label=f"{task.name} loss")
        if task.val_losses:
            axes.plot(range(1, len(task.val_losses) + 1), task.val_losses, color=colour,
                      linewidth=width, linestyle="--", label=f"{task.name} val_loss")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("epoch")
    axes.set_ylabel("loss")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return True
