"""docs/reference/ is what the code generates (python -m chaos.docgen), and the generator
misses nothing: every plugin option pytest knows, every profile field with a description."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from chaos import docgen
from chaos.docgen import cli, options, profile
from chaos.profile.models import Profile


def test_the_committed_reference_pages_are_what_the_code_generates():
    stale = docgen.stale()
    assert not stale, (f"docs/reference/{', docs/reference/'.join(stale)} differ from what the code generates: run "
                       f"`{docgen.REGENERATE}` and commit the pages")


def test_a_page_edited_by_hand_or_missing_is_stale(tmp_path):
    docgen.write(tmp_path)
    assert docgen.stale(tmp_path) == []
    (tmp_path / "options.md").write_text((tmp_path / "options.md").read_text() + "a line written by hand\n")
    (tmp_path / "profile.md").unlink()
    assert docgen.stale(tmp_path) == ["options.md", "profile.md"]


def test_the_options_page_lists_every_option_pytest_registers(pytestconfig):
    recorded = {name.lstrip("-").replace("-", "_") for o in options.plugin_options() for name in o.names}
    registered = {k for k in vars(pytestconfig.option) if k.startswith("chaos_")}
    assert registered and registered == recorded, (registered ^ recorded)


def test_every_profile_section_and_field_is_on_the_page():
    page = profile.render()
    for s in profile.sections():
        assert f"## {s.title}\n" in page
        for name, f in s.model.model_fields.items():
            assert f"| `{f.alias or name}` |" in page, f"{s.title}.{name}"
    assert "## `kubernetes.hyperpod`" in page and "| `in_cluster` |" in page and "| `request_timeout_s` |" in page


class Undocumented(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    documented: int = 1
    """Has one."""
    bare: int = 2


def test_a_profile_field_without_a_description_stops_the_generator():
    with pytest.raises(ValueError, match=r"profile field \(top\)\.bare \(Undocumented\.bare\) has no description"):
        profile._section(profile.Section(Undocumented, ["(top)"]), {Undocumented: "(top)"})
    ray = Profile.model_fields["ray"].annotation
    assert "| `dashboard_url` |" in profile._section(profile.Section(ray, ["ray"]), {ray: "`ray`"})


def test_every_ray_chaos_subcommand_answers_help(monkeypatch):
    page = cli.render()
    assert cli.subcommands() and all(f"## `ray-chaos {c}`\n\n```\nusage: ray-chaos {c} " in page
                                     for c in cli.subcommands())
    real = cli.help_text
    monkeypatch.setattr(cli, "help_text", lambda *a: "" if a == ("sweep",) else real(*a))
    with pytest.raises(ValueError, match="ray-chaos sweep: --help prints no usage"):
        cli.render()
