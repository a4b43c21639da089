"""docs/configuration.md's settings table is generated from coordinator/config.py's definitions
(tools/gen_config_doc.py) and cannot drift: a setting added, renamed or re-documented without
`python -m tools.gen_config_doc` fails here."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
import types

from coordinator.config import Config
from tools import gen_config_doc as gen


def test_the_doc_is_what_the_definitions_generate():
    doc = gen.DOC.read_text()
    assert gen.splice(doc, gen.render(gen.read_settings())) == doc, (
        "docs/configuration.md is stale: run `python -m tools.gen_config_doc`")


def test_every_setting_has_a_row_with_its_flag_variable_and_default():
    doc = gen.DOC.read_text()
    table = doc[doc.index(gen.BEGIN):doc.index(gen.END)]
    rows = {line.split("|")[1].strip(" `"): line for line in table.splitlines() if line.startswith("| `")}
    assert set(rows) == {f.name for f in dataclasses.fields(Config)}
    assert "| `port` | `--port`, `HERD_PORT` | `9092` |" in rows["port"]
    assert "`--topic NAME:PARTITIONS` (repeatable), `HERD_TOPICS`" in rows["topics"]
    assert "`--auto-create-topics` / `--no-auto-create-topics`" in rows["auto_create_topics"]
    assert "| `group.max.size` |" in rows["group_max_size"]  # the #: Kafka: line
    assert "| unset |" in rows["metrics_port"]


SOURCE = textwrap.dedent('''
    from dataclasses import dataclass


    @dataclass(frozen=True)
    class Config:
        # where it listens
        #: address to listen on
        host: str = "127.0.0.1"

        # a new section: with more words (and a parenthesis)
        #: Kafka: some.kafka.name
        #: a documented setting
        #: on two lines
        documented_ms: int = 5
        undocumented: bool = False  # new.kafka.setting: only a trailing comment
        # a plain comment right after a field documents the next one
        commented: str | None = None

        def method(self):
            return 1
''')


def _module(source: str, monkeypatch):
    mod = types.ModuleType("fake_config")
    monkeypatch.setitem(sys.modules, "fake_config", mod)  # dataclasses looks its module up
    exec(compile(source, "fake_config.py", "exec"), mod.__dict__)
    return mod.Config


def test_a_new_setting_appears_from_its_definition_alone(monkeypatch):
    settings = gen.read_settings(_module(SOURCE, monkeypatch), SOURCE)
    got = {s.name: (s.section, s.kafka, " ".join(s.doc)) for s in settings}
    assert got == {
        "host": ("Where it listens", "", "address to listen on"),
        "documented_ms": ("A new section", "some.kafka.name", "a documented setting on two lines"),
        "undocumented": ("A new section", "new.kafka.setting", "new.kafka.setting: only a trailing comment"),
        "commented": ("A new section", "", "a plain comment right after a field documents the next one"),
    }
    table = gen.render(settings)
    assert "### A new section\n" in table
    assert ("| `undocumented` | `--undocumented` / `--no-undocumented`, `HERD_UNDOCUMENTED` | `false` | "
            "`new.kafka.setting` |") in table
    assert "| `commented` | `--commented`, `HERD_COMMENTED` | unset | — |" in table


def test_check_fails_on_a_stale_doc_and_the_tool_rewrites_it(tmp_path):
    doc = tmp_path / "configuration.md"
    fresh = gen.DOC.read_text()
    doc.write_text(fresh.replace("| `fsync` |", "| `fsync_renamed` |"))
    check = subprocess.run([sys.executable, "-m", "tools.gen_config_doc", "--check", "--doc", str(doc)],
                           cwd=gen.REPO, capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "is stale: run `python -m tools.gen_config_doc`" in check.stderr
    write = subprocess.run([sys.executable, "-m", "tools.gen_config_doc", "--doc", str(doc)],
                           cwd=gen.REPO, capture_output=True, text=True, timeout=60)
    assert write.returncode == 0 and doc.read_text() == fresh
