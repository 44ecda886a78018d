"""README.md says what the code does (issue 24 item 7).

Proves: every fenced ```python or ```sh block marked `<!-- runnable -->` on the line before
it runs as written and exits 0, in document order, in one temporary directory (so a later
shell snippet looks at what an earlier program made), with the test's virtualenv's bin/
first on PATH and the repository importable; the engine's walk-through is among them; and
every `./dev COMMAND` the quick start names is a command `./dev help` lists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = "<!-- runnable -->"
SNIPPET_S_MAX = 180  # one snippet's run, generous for a loaded 2-core machine
RUNNABLE = re.compile(rf"^{re.escape(MARKER)}\n```(python|sh)\n(.*?)^```$", re.M | re.S)


def runnable_snippets() -> list[tuple[str, str, int]]:
    """(language, code, line number of its fence) of each runnable snippet, in order."""
    text = README.read_text("utf-8")
    return [
        (m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2)
        for m in RUNNABLE.finditer(text)
    ]


def test_every_marker_is_on_a_python_or_sh_fence() -> None:
    text = README.read_text("utf-8")
    markers = re.findall(rf"^{re.escape(MARKER)}$", text, re.M)  # on a line of its own
    assert len(markers) == len(runnable_snippets())


def test_the_runnable_snippets_include_the_engine_walk_through() -> None:
    snippets = runnable_snippets()
    assert any(lang == "python" and "Engine.open(" in code for lang, code, _ in snippets)
    assert any(lang == "sh" and "python -m engine history" in code for lang, code, _ in snippets)


def test_every_runnable_snippet_runs_as_written(tmp_path: Path) -> None:
    env = dict(os.environ)
    # The test's virtualenv's bin/ first, as `.venv/bin` for a reader (its `python`).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    work = tmp_path / "work"
    work.mkdir()
    for index, (lang, code, line) in enumerate(runnable_snippets()):
        if lang == "python":
            script = work / f"snippet-{index}.py"
            script.write_text(code, "utf-8")
            argv = [sys.executable, str(script)]
        else:
            argv = ["bash", "-e", "-o", "pipefail", "-c", code]
        done = subprocess.run(
            argv, cwd=work, env=env, capture_output=True, text=True, timeout=SNIPPET_S_MAX
        )
        assert done.returncode == 0, (
            f"README.md line {line} ({lang}) exited {done.returncode}:\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )


def test_the_quick_start_names_only_commands_dev_has() -> None:
    text = README.read_text("utf-8")
    quick_start = text[text.index("## Quick start") : text.index("## What works today")]
    named = set(re.findall(r"^\./dev (\w+)", quick_start, re.M))
    assert "setup" in named
    usage = subprocess.run(
        ["bash", str(ROOT / "dev"), "help"], capture_output=True, text=True, timeout=30
    )
    listed = set(re.findall(r"^  (\w+)", usage.stdout + usage.stderr, re.M))
    assert named <= listed, f"./dev help lists {sorted(listed)}"


def test_the_figures_the_readme_gives_are_the_code_s() -> None:
    """Each claim (a README phrase) beside the constant it states: changing one without the
    other fails here (the compaction threshold was "a third dead" while the code said 0.5)."""
    from engine import limits
    from engine.compaction import Policy
    from logsvc.shard import scheduler

    text = " ".join(README.read_text("utf-8").split())  # line breaks as spaces
    claims = {
        "`compact_deleted_fraction` 0.5": limits.COMPACT_DELETED_FRACTION == 0.5,
        "half or more of its rows dead": Policy().compact_deleted_fraction == 0.5,
        "`flush_age_ms` 60,000": limits.FLUSH_AGE_MS == 60_000,
        "`l0_bytes_max` 64 MiB": limits.L0_BYTES_MAX == 64 * 2**20,
        "commits that append wait past twice that": limits.L0_BYTES_HARD_MAX
        == 2 * limits.L0_BYTES_MAX,
        "`merge_l1_blocks` 16": limits.MERGE_L1_BLOCKS == 16,
        "`checkpoint_interval_ms` 60,000": limits.CKP_INTERVAL_MS == 60_000,
        "also after 200,000 WAL entries": limits.CKP_WAL_ENTRIES == 200_000,
        "`checkpoint_wal_reserve_entries` 1,024": limits.CKP_WAL_RESERVE_ENTRIES == 1024,
        "(`cache_bytes`, 256 MiB)": limits.CACHE_BYTES == 256 * 2**20,
        "every eighth is global": limits.CKP_GLOBAL_EVERY == 8,
        "the two newest are kept": limits.CKP_RETAINED == 2,
        "4 by default, whatever the shard count": scheduler.WORKERS_DEFAULT == 4,
    }
    assert "a third dead" not in text
    for phrase, true in claims.items():
        assert phrase in text, f"README.md no longer says {phrase!r}: update this test"
        assert true, f"README.md says {phrase!r}, the code no longer does"
