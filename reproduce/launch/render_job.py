"""The render job of ``--launcher slurm``, on a compute node, once the arrays it waits on have
ended: apart from the array task's module (``task``), so that the job's fresh Python imports no
trainer (Lightning, torch's compiler: ~5 s of a core on a slow CPU) to render a table."""

from __future__ import annotations


def render_job(spec_path: str) -> str:
    """The render job's body, on a node: the table from the records there are (as ``--render``),
    once the arrays it waits on have ended, however they ended."""
    from reproduce.paths import results_dir
    from reproduce.records.sweep import load_spec
    from reproduce.tables.render import render
    from reproduce.util.logs import quiet_libraries

    quiet_libraries()
    spec = load_spec(spec_path)
    out = results_dir() / f"{spec.table}.md"
    render(spec, out, log=True)
    print(f"rendered {out}", flush=True)
    return str(out)
