"""The connection snippets of README.md and docs/ are what each host reads, and name what exists.

Every fenced ```json block parses as strict JSON (no host config here needs comments, so none are
allowed). A host configuration says its file in the block's title (```json title=".vscode/mcp.json")
and has that host's shape: VS Code's top-level key is `servers`, the others' `mcpServers`, with the
fields each host documents. Every command a snippet starts (JSON `command`/`args`, `claude mcp add
... -- CMD`, `npx @modelcontextprotocol/inspector CMD`) is one of this distribution's console
scripts, or `uvx`/`pipx run` of this distribution and one of its scripts; the arguments it passes
parse with the real CLI's own parser (typer's, options, values and subcommands alike); every
environment variable it sets is a real setting; every URL is an MCP endpoint (`.../mcp`). And the
hosts people use each have a snippet for stdio, for HTTP with a bearer token, and for OAuth.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main

from controlplane.cli import app
from controlplane.settings import Settings
from controlplane_providers.base import ProviderSettings
from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DISTRIBUTION = PYPROJECT["project"]["name"]
SCRIPTS = set(PYPROJECT["project"]["scripts"])
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# The file each host reads, and what a server entry in it may hold (as each host documents it).
HOSTS = {
    ".mcp.json": ("Claude Code", "mcpServers", {"type", "command", "args", "env", "url", "headers", "oauth"}),
    "claude_desktop_config.json": ("Claude Desktop", "mcpServers", {"command", "args", "env"}),
    ".cursor/mcp.json": ("Cursor", "mcpServers", {"type", "command", "args", "env", "url", "headers", "auth"}),
    ".vscode/mcp.json": ("VS Code", "servers", {"type", "command", "args", "env", "envFile", "url", "headers"}),
}
INSPECTOR = "@modelcontextprotocol/inspector"


def known_env_vars() -> set[str]:
    """The settings of the server and of every provider, and the CLI's own variables."""
    names = {f"CONTROLPLANE_{f.upper()}" for f in Settings.model_fields}
    for module in ("local", "aws_batch", "cloud_run", "container_apps"):
        importlib.import_module(f"controlplane_providers.{module}")
    for cls in ProviderSettings.__subclasses__():
        prefix = cls.model_config.get("env_prefix", "")
        names |= {f"{prefix}{f}".upper() for f in cls.model_fields}

    def walk(cmd: Any) -> None:
        for p in cmd.params:
            envvars = p.envvar if isinstance(p.envvar, list | tuple) else [p.envvar]
            names.update(e for e in envvars if e)
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    return names


ENV = known_env_vars()


def parse_cli(args: list[str]) -> None:
    """Parse `controlplane ARGS` with the real CLI's own parser (typer's): a TyperException for an
    unknown subcommand or flag, or a value the option refuses. Nothing runs."""
    cmd: Any = typer.main.get_command(app)
    parent: Any = None
    name = "controlplane"
    while hasattr(cmd, "commands"):  # a group: the next word names its subcommand
        assert args and not args[0].startswith("-"), f"a subcommand of {name}: {args}"
        ctx = cmd.context_class(cmd, info_name=name, parent=parent)
        sub = cmd.get_command(ctx, args[0])
        assert sub is not None, f"no subcommand {args[0]!r} of {name}"
        parent, name, cmd, args = ctx, args[0], sub, args[1:]
    cmd.make_context(name, list(args), parent=parent)


def check_server_command(command: str, args: list[str]) -> None:
    """`command args` starts this project's server: a console script of it, or uvx/pipx run of it."""
    if command in ("uvx", "pipx"):
        if command == "pipx":
            assert args[:1] == ["run"], args
            args = args[1:]
        if args[:1] == ["--from"]:
            assert args[1] == DISTRIBUTION, args
            script, args = args[2], args[3:]
        else:
            assert args[0] == DISTRIBUTION, f"{command} {args[0]} does not name {DISTRIBUTION}"
            script, args = args[0], args[1:]
    else:
        script = Path(command).name
    assert script in SCRIPTS, f"{script} is not a console script of {DISTRIBUTION} ({sorted(SCRIPTS)})"
    parse_cli(args)


def check_env(env: dict[str, Any]) -> None:
    for key, value in env.items():
        assert isinstance(value, str)
        assert key in ENV or not key.startswith("CONTROLPLANE_"), f"{key} is not a setting"
        assert key.startswith("CONTROLPLANE_") or key == "AUTH_HEADER", f"{key}: not the server's"


def check_url(url: str) -> None:
    assert re.fullmatch(r"https?://[^/]+/mcp", url), f"{url} is not an MCP endpoint"


def bearer(value: str) -> bool:
    return bool(re.fullmatch(r"Bearer \S+", value))


@dataclass
class Coverage:
    kinds: dict[str, set[str]] = field(default_factory=dict)

    def add(self, host: str, kind: str) -> None:
        self.kinds.setdefault(host, set()).add(kind)


def fenced(path: Path, lang: str) -> list[tuple[str, str]]:
    """(info string after the language, body) of each ```lang block."""
    return re.findall(rf"^```{lang}([^\n]*)\n(.*?)^```", path.read_text(), re.MULTILINE | re.DOTALL)


def check_host_config(title: str, config: dict[str, Any], cov: Coverage) -> None:
    host, top, allowed = HOSTS[title]
    assert top in config, f"{title}: servers go under {top!r}"
    assert set(config) <= {top} | ({"inputs"} if host == "VS Code" else set()), f"{title}: {sorted(config)}"
    inputs = {i["id"] for i in config.get("inputs", [])}
    for i in config.get("inputs", []):
        assert i["type"] == "promptString" and i["description"], i
    for name, server in config[top].items():
        assert set(server) <= allowed, f"{title} {name}: {sorted(set(server) - allowed)}"
        for ref in re.findall(r"\$\{input:([^}]+)\}", json.dumps(server)):
            assert ref in inputs, f"{title}: ${{input:{ref}}} is not among its inputs"
        kind = server.get("type")
        if "command" in server:
            assert kind in (None, "stdio"), server
            args = server.get("args", [])
            assert isinstance(args, list) and all(isinstance(a, str) for a in args)
            check_env(server.get("env", {}))
            if server["command"] == "npx" and args[:1] == ["mcp-remote"]:  # the stdio bridge to an HTTP server
                check_url(args[1])
                headers = [args[i + 1] for i, a in enumerate(args) if a == "--header"]
                assert all(h.startswith("Authorization:") for h in headers)
                cov.add(host, "token" if headers else "oauth")
            else:
                check_server_command(server["command"], args)
                cov.add(host, "stdio")
        else:
            check_url(server["url"])
            if host in ("Claude Code", "VS Code"):
                assert kind == "http", f"{title} {name}: type 'http'"
            headers = server.get("headers", {})
            assert set(headers) <= {"Authorization"}
            if headers:
                assert bearer(headers["Authorization"].replace("${", "$").replace("}", "")), headers
                cov.add(host, "token")
            else:
                if "oauth" in server:
                    assert set(server["oauth"]) <= {"clientId", "callbackPort", "scopes"}
                if "auth" in server:
                    assert set(server["auth"]) <= {"CLIENT_ID", "CLIENT_SECRET", "scopes"}
                cov.add(host, "oauth")


def check_shell_line(words: list[str], cov: Coverage) -> None:
    if words[:3] == ["claude", "mcp", "add"]:
        rest = words[3:]
        if "--" in rest:  # stdio: the server's command after --
            i = rest.index("--")
            options, command = rest[:i], rest[i + 1:]
            for j, w in enumerate(options):
                if w in ("-e", "--env"):
                    key = options[j + 1].split("=", 1)[0]
                    check_env({key: ""})
            check_server_command(command[0], command[1:])
            cov.add("Claude Code", "stdio")
            return
        assert rest[:2] == ["--transport", "http"], rest
        positional = [w for j, w in enumerate(rest) if not w.startswith("-") and not rest[j - 1].startswith("--")]
        check_url(positional[-1])
        headers = [rest[j + 1] for j, w in enumerate(rest) if w == "--header"]
        assert all(h.startswith("Authorization: Bearer ") for h in headers)
        cov.add("Claude Code", "token" if headers else "oauth")
    elif words[:2] == ["npx", INSPECTOR]:
        rest = words[2:]
        if rest and re.match(r"https?://", rest[0]) or "--cli" in rest and any(re.match(r"https?://", w) for w in rest):
            url = next(w for w in rest if re.match(r"https?://", w))
            check_url(url)
            headers = [rest[j + 1] for j, w in enumerate(rest) if w == "--header"]
            assert rest[rest.index("--transport") + 1] == "http"
            assert headers and all(h.startswith("Authorization: Bearer ") for h in headers)
            cov.add("MCP Inspector", "token")
            return
        while rest and rest[0] == "-e":
            check_env({rest[1].split("=", 1)[0]: ""})
            rest = rest[2:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        check_server_command(rest[0], rest[1:])
        cov.add("MCP Inspector", "stdio")


def test_every_json_snippet_parses_and_every_host_config_names_its_host() -> None:
    for path in FILES:
        for info, body in fenced(path, "json"):
            data = json.loads(body)  # strict JSON: a host config with comments would fail here
            title = re.search(r'title="([^"]+)"', info)
            if isinstance(data, dict) and ({"mcpServers", "servers"} & set(data)):
                assert title and title.group(1) in HOSTS, f"{path.name}: a host config must say its file: {info!r}"


def snippets() -> Coverage:
    cov = Coverage()
    for path in FILES:
        for info, body in fenced(path, "json"):
            title = re.search(r'title="([^"]+)"', info)
            if title and title.group(1) in HOSTS:
                check_host_config(title.group(1), json.loads(body), cov)
        for _, body in fenced(path, "bash"):
            for line in body.splitlines():
                line = line.split("  #", 1)[0].strip()
                if line and not line.startswith("#"):
                    words = shlex.split(line.replace("$", "\\$"))
                    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value command
                        check_env({words[0].split("=", 1)[0]: ""})
                        words = words[1:]
                    if words[:1] in (["controlplane"], ["mcp-controlplane"]):
                        parse_cli([w for w in words[1:] if w != "&"])
                    else:
                        check_shell_line(words, cov)
    return cov


def test_every_snippet_names_real_commands_flags_and_settings() -> None:
    snippets()


@pytest.mark.parametrize("host,kinds", [
    ("Claude Code", {"stdio", "token", "oauth"}),
    ("Claude Desktop", {"stdio", "token", "oauth"}),
    ("Cursor", {"stdio", "token", "oauth"}),
    ("VS Code", {"stdio", "token", "oauth"}),
    ("MCP Inspector", {"stdio", "token"}),  # its OAuth is a guided flow in its web interface
])
def test_each_host_has_stdio_token_and_oauth_snippets(host: str, kinds: set[str]) -> None:
    assert kinds <= snippets().kinds.get(host, set())


def test_the_checks_refuse_what_does_not_exist() -> None:
    """The checks above are not vacuous: a wrong flag, script, distribution or setting is refused."""
    with pytest.raises(typer.TyperException):
        parse_cli(["serve", "--transport", "websocket"])
    with pytest.raises(typer.TyperException):
        parse_cli(["serve", "--stdio"])
    with pytest.raises(AssertionError):
        parse_cli(["server"])
    parse_cli(["serve", "--transport", "http", "--port", "8000"])
    with pytest.raises(AssertionError):
        check_server_command("controlplane-server", ["serve"])
    with pytest.raises(AssertionError):
        check_server_command("uvx", ["controlplane", "serve"])
    with pytest.raises(AssertionError):
        check_env({"CONTROLPLANE_TOKENS": "t=alice"})
    with pytest.raises(AssertionError):
        check_host_config(".vscode/mcp.json", {"mcpServers": {"cp": {"command": "controlplane", "args": ["serve"]}}},
                          Coverage())
