"""The branch gateway as the one door to its engines (plugin_utils/gateway.py, roles/gateway, docs/security.md):
the keys it enforces, the paths it forwards, who learns which backend served; and the nginx configuration the
role renders, checked by nginx itself (`nginx -t`: the venv's, which `make venv` takes out of Debian's nginx
package, else one on PATH)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible_collections.atlas.serving.plugins.plugin_utils import gateway as gw

from support.tools import venv_tool

ROOT = Path(__file__).resolve().parents[3]
NGINX = venv_tool("nginx")


def test_the_key_map_accepts_the_branch_s_keys_and_nothing_else():
    body = gw.keys_map(["new-key_1", "previous.key~2", "new-key_1"], branch="east")
    assert body.splitlines() == ["default 0;", '"Bearer new-key_1" 1;', '"Bearer previous.key~2" 1;']


@pytest.mark.parametrize("sep", ['"', " ", ";", "\n", "$", "{", "}", "ключ", "=x"])
def test_a_key_nginx_cannot_carry_is_refused_without_naming_it(sep):
    key = f"secretpart{sep}tail"
    with pytest.raises(gw.GatewayError, match="RFC 6750") as caught:
        gw.keys_map(["good-key", key], branch="west")
    assert "API key number 2" in str(caught.value)
    assert "secretpart" not in str(caught.value) and "good-key" not in str(caught.value)
    assert gw.keys_problem(["good-key", key], branch="west") == str(caught.value)


def test_a_branch_without_a_key_is_refused_unless_the_site_opts_out_loudly():
    with pytest.raises(gw.GatewayError, match="branch east: no API key.*gateway_allow_no_api_key"):
        gw.keys_map([], branch="east")
    assert gw.keys_map([], allow_none=True).splitlines()[-1] == "default 1;"
    assert gw.keys_problem(["k"]) == ""


def test_only_the_openai_paths_and_those_added_on_purpose_are_forwarded():
    assert gw.paths() == ["/v1/completions", "/v1/chat/completions", "/v1/models"]
    records = [("n1", {"api_paths": ["/v1/embeddings"]}), ("n2", {"port": 8000}), ("n3", {"api_paths": ["/v1/models"]})]
    assert gw.paths(["/v1/rerank"], records)[3:] == ["/v1/rerank", "/v1/embeddings"]


@pytest.mark.parametrize("bad", ["/invocations", "/v1/../invocations", "/v1/", "v1/completions", "/v1/a b",
                                 "/v1/~x", "/V1/models", "/v1/models?x=1"])
def test_a_path_that_is_no_api_path_is_refused(bad):
    with pytest.raises(gw.GatewayError, match="not an API path"):
        gw.paths([bad])
    with pytest.raises(gw.GatewayError, match="n1: the serving profile's api_paths"):
        gw.paths([], [("n1", {"api_paths": [bad]})])


def test_which_backend_served_is_told_only_to_the_monitoring_network():
    assert gw.trusted_sources([("mon", "10.0.0.30")], ["10.1.0.0/24", "10.0.0.30"]) == ["10.0.0.30/32", "10.1.0.0/24"]
    with pytest.raises(gw.GatewayError, match="monitoring host mon: ansible_host: 'mon.bank' is not an IP"):
        gw.trusted_sources([("mon", "mon.bank")])


def _render(**overrides) -> str:
    """The role's nginx site as the role renders it (its defaults, then the variables the tasks compute)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "roles/gateway/templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["comment"] = lambda text: "# " + text
    env.filters["bool"] = lambda value: str(value).lower() in ("true", "yes", "1")
    values = {**yaml.safe_load((ROOT / "roles/gateway/defaults/main.yml").read_text()),
              "ansible_managed": "managed", "gateway_branch": "east",
              "__gateway_header_sources": ["10.0.0.30/32"], "__gateway_paths": gw.paths(), **overrides}
    return env.get_template("atlas-gateway.conf.j2").render(**values)


def test_the_site_forwards_exact_api_paths_with_a_key_over_tls_and_404s_the_rest():
    conf = _render()
    assert "listen 8443 ssl;" in conf and "ssl_certificate /etc/nginx/atlas-tls/server.pem;" in conf
    locations = [line.split()[1:3] for line in conf.splitlines() if line.strip().startswith("location")]
    assert locations == [["=", "/v1/completions"], ["=", "/v1/chat/completions"], ["=", "/v1/models"], ["/", "{"]]
    assert conf.count("if ($atlas_branch_east_key_ok = 0)") == 3
    assert conf.count("proxy_pass") == 3
    assert "return 404" in conf.split("location / {")[1]
    assert "add_header X-Atlas-Backend $upstream_addr" not in conf
    assert "add_header X-Atlas-Backend $atlas_branch_east_backend always;" in conf
    plain = _render(gateway_tls=False)
    assert "listen 8443;" in plain and "ssl_certificate" not in plain and "PLAIN HTTP" in plain


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed: `make venv` takes it out of Debian's nginx package")
def test_nginx_accepts_the_rendered_site(tmp_path: Path):
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "east.conf").write_text(gw.keys_map(["k1"]))
    site = _render(gateway_keys_dir=str(keys), gateway_backend_dir=str(tmp_path / "backends"), gateway_tls=False)
    (tmp_path / "backends/east").mkdir(parents=True)
    (tmp_path / "backends/east/n1.conf").write_text("server 127.0.0.1:8000;\n")
    # the paths nginx -t opens and creates, here rather than under /var (no nginx package installed on the host)
    paths = "".join(f"{kind}_temp_path {tmp_path / kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                          "scgi")) + "access_log stderr;\n"
    (tmp_path / "nginx.conf").write_text(f"error_log stderr;\nevents {{}}\nhttp {{\n{paths}{site}\n}}\n")
    run = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert "test is successful" in run.stderr


def test_nginx_refuses_a_site_that_is_not_nginx(tmp_path: Path):
    """The check above can fail: the same run refuses a site with a directive nginx does not know."""
    if NGINX is None:
        pytest.skip("nginx is not installed: `make venv` takes it out of Debian's nginx package")
    (tmp_path / "nginx.conf").write_text("error_log stderr;\nevents {}\n"
                                         "http {\nserver { listen 8443; not_nginx on; }\n}\n")
    run = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                         capture_output=True, text=True, check=False)
    assert run.returncode != 0 and 'unknown directive "not_nginx"' in run.stderr
