"""Names a user hands to atlasctl and the collection (module_utils/names.py): one grammar per kind, refused with
exit status 2, one line naming the input, the value escaped and the grammar as the fix; never a traceback."""

from __future__ import annotations

import pytest
import yaml
from ansible_collections.atlas.serving.plugins.module_utils import names
from ansible_collections.atlas.serving.plugins.plugin_utils import release_id
from ansible_collections.atlas.serving.plugins.plugin_utils import site_data as site

from atlasctl import cli, exitcodes
from atlasctl import inventory as shared
from atlasctl.errors import UsageError

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FAST = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = sorted(names.KINDS)


def _refused(capsys, argv: list[str], *says: str) -> str:
    """Run atlasctl; exit 2, a one-line error (and its fix) saying ``says``, every character printable."""
    assert cli.main(argv) == exitcodes.USAGE
    err = capsys.readouterr().err
    first, *rest = err.rstrip("\n").split("\n")
    assert first.startswith("atlasctl: error: ") and all(line.startswith("  fix: ") for line in rest), err
    assert "Traceback" not in err and all(c.isprintable() for c in err.replace("\n", ""))
    for text in says:
        assert text in err, err
    return err


# --- the CLI's entry points -------------------------------------------------------------------


def test_bundle_build_refuses_a_bundle_name_that_leaves_its_directory(tmp_path, capsys):
    spec = tmp_path / "b.yml"
    spec.write_text("name: ../../x\n")
    _refused(capsys, ["bundle", "build", "--spec", str(spec), "--out", str(tmp_path / "out")],
             "name '../../x'", "bundle name", "fix: write a bundle name")
    assert not (tmp_path / "out").exists()


def test_bundle_build_refuses_a_model_name_with_a_newline(tmp_path, capsys):
    spec = tmp_path / "b.yml"
    spec.write_text(f'name: t\nmodels:\n  - {{name: "m\\nx", path: {tmp_path}}}\n')
    _refused(capsys, ["bundle", "build", "--spec", str(spec), "--out", str(tmp_path / "out")],
             "models entry 'm\\nx'", "U+000A", "fix: write a model name")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("release", ["../r", "r\u202e1", "{{ lookup('pipe', 'id') }}"])
def test_bundle_build_refuses_a_release_that_is_not_a_name(tmp_path, capsys, release):
    spec = tmp_path / "b.yml"
    spec.write_text(yaml.safe_dump({"name": "t", "release": release}))
    _refused(capsys, ["bundle", "build", "--spec", str(spec), "--out", str(tmp_path / "out")], "release")


@pytest.mark.parametrize("dest", ["/srv/a\nb", "/srv/x\u202e", "/srv/{{ x }}"])
def test_bundle_push_refuses_a_dest_with_a_control_character_or_a_template(tmp_path, capsys, dest):
    _refused(capsys, ["bundle", "push", "-i", str(tmp_path), "--src", str(tmp_path), "--dest", dest],
             f"--dest {dest!r}", "fix:")


@pytest.mark.parametrize("prefix", ["/etc", "models/x/", "models//x", "models/../etc", "models/a\nb", "-x"])
def test_models_prefix_is_refused_not_rewritten(tmp_path, capsys, prefix):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x").write_text("x")
    _refused(capsys, ["models", "manifest", str(tmp_path / "m"), "--format", "json", "--out", "-",
                      f"--prefix={prefix}"], f"--prefix {prefix!r}")


# --- inventories --------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["{{ lookup('pipe', 'id') }}", "{%if 1%}x{%endif%}", "{{x}}", "n1\u202e",
                                  "a/b", "-oProxyCommand=x", "..", "x" * 254])
def test_an_ansible_host_that_is_not_a_host_name_is_refused(host):
    with pytest.raises(UsageError) as caught:
        shared.target("n1", {"ansible_host": host})
    message = caught.value.render()
    assert "inventory host 'n1': ansible_host" in message and repr(host) in message and "fix:" in message


def test_an_inventory_host_name_that_is_a_template_is_refused():
    with pytest.raises(UsageError, match="inventory host name"):
        shared.target("{{ x }}", {})


def test_config_render_refuses_a_templated_ansible_host(tmp_path, monkeypatch):
    from atlasctl import planner

    profile = "vllm-ascend-0.11.0-mistral-7b-8x64g"
    hostvars = {"n1": {"serving_profile": profile, "ansible_host": "{{ lookup('env', 'HOME') }}"}}
    with pytest.raises(UsageError, match=r"ansible_host .*is not a plain host name.*template"):
        planner.rank_of("inv", "n1", hostvars=hostvars)


def test_a_placeholder_value_with_a_template_never_fills_a_profile():
    profile = {"command": ["serve", "--host", "{{ serving_host }}"]}
    with pytest.raises(site.SiteDataError, match="serving_host"):
        site.fill_placeholders(profile, {"serving_host": "{{ lookup('pipe', 'id') }}"}, "p.yml")
    with pytest.raises(site.SiteDataError, match="U\\+000A"):
        site.fill_placeholders(profile, {"serving_host": "10.0.0.1\nEVIL=1"}, "p.yml")
    assert site.fill_placeholders(profile, {"serving_host": "10.0.0.1"}, "p.yml")["command"][-1] == "10.0.0.1"


def test_a_serving_profile_name_that_leaves_the_profile_directories_is_refused(tmp_path):
    with pytest.raises(site.SiteDataError, match=r"serving_profile '\.\./\.\./etc/x' is not a plain profile name"):
        site.find_profile("../../etc/x", [], str(tmp_path))


def test_release_ids_are_the_names_layers_release_kind():
    assert release_id.RELEASE_ID is names.KINDS["release"].pattern
    assert release_id.problem("bank-2026.12.0") == ""
    assert "not a release id" in release_id.problem("r1\u202e")


# --- the grammar ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_accepts_its_example_and_names_the_input(kind):
    example = names.KINDS[kind].example.split(" or ")[0]
    assert names.check(example, kind, "--x") == example
    with pytest.raises(names.BadName) as caught:
        names.check(example + "\n", kind, "--x")
    assert str(caught.value).startswith(f"--x {example + chr(10)!r} is not a plain {kind} name")
    assert names.KINDS[kind].rule in caught.value.rule


CONTROL = st.characters(whitelist_categories=("Cc", "Cf", "Zl", "Zp"))
BAD_PART = CONTROL | st.sampled_from(["/", "..", "{{", "}}", "{%", "%}", "{#", "#}", "\\"])
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@FAST
@given(st.sampled_from(KINDS), TEXT, BAD_PART, TEXT)
def test_a_string_with_a_control_character_a_separator_or_a_template_is_never_a_name(kind, head, bad, tail):
    value = head + bad + tail
    assert names.problem(value, kind)
    with pytest.raises(names.BadName) as caught:
        names.check(value, kind, "--name")
    assert repr(value) in str(caught.value)
    assert all(c.isprintable() for c in str(caught.value))


@FAST
@given(st.sampled_from(KINDS), TEXT)
def test_every_accepted_name_fullmatches_its_grammar(kind, value):
    if names.is_name(value, kind):
        grammar = names.KINDS[kind]
        assert grammar.pattern.fullmatch(value) and ".." not in value and len(value) <= grammar.longest
        assert not names.unsafe_text(value) and value[0] not in "-." and "/" not in value
    else:
        assert names.problem(value, kind)


@FAST
@given(st.sampled_from(KINDS), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,40}", fullmatch=True))
def test_plain_names_are_accepted(kind, value):
    assert names.is_name(value, kind), names.problem(value, kind)
