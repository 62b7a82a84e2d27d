"""Rebuild the example notebooks from their scripts and execute them.

The ``.py`` scripts are the source of truth. Each is split into cells at
``# %%`` lines (``# %% [markdown]`` starts a markdown cell made of the comment
lines that follow); lines marked ``# script only`` are left out of the
notebook. Then the notebook is run for real and saved with its outputs::

    python examples/build_notebooks.py            # all examples
    python examples/build_notebooks.py react_agent
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
EXAMPLES = ["react_agent", "reflexion_agent", "multi_worker_routing", "openai_gateway"]


def cells_from_script(text: str) -> list[tuple[str, str]]:
    """(cell type, source) pairs of a ``# %%`` script."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# %%"):
            cells.append(("markdown" if "[markdown]" in line else "code", []))
        elif cells and "# script only" not in line:
            cells[-1][1].append(line)
    out = []
    for kind, lines in cells:
        if kind == "markdown":
            lines = [line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines]
        source = "\n".join(lines).strip("\n")
        if source:
            out.append((kind, source))
    return out


def notebook_from_script(script: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, source in cells_from_script(script.read_text()):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        nb.cells.append(make(source))
    return nb


def execute(nb: nbformat.NotebookNode, workdir: str) -> nbformat.NotebookNode:
    # workdir: where the notebook runs (and its plots are saved)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": workdir}}).execute()
    return nb


def main(names: list[str]) -> None:
    for name in names or EXAMPLES:
        nb = notebook_from_script(HERE / f"{name}.py")
        for i, cell in enumerate(nb.cells):
            cell["id"] = f"{name.replace('_', '-')}-{i}"  # stable ids keep diffs small
        with tempfile.TemporaryDirectory() as workdir:
            execute(nb, workdir)
        nbformat.write(nb, HERE / f"{name}.ipynb")
        print(f"wrote {name}.ipynb")


if __name__ == "__main__":
    main(sys.argv[1:])
