"""deploy/windows, checked as far as Linux can: the WinSW configuration parsed and run through se-exporter's own
argument and environment handling, install.ps1 parsed by a real PowerShell grammar (tree-sitter) and its steps,
parameters and commands checked. Nothing here runs Windows: see README "What is verified only statically"."""

from __future__ import annotations

import ntpath
import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import tree_sitter_powershell
from tree_sitter import Language, Node, Parser

from se_exporter.cli import build_parser
from se_exporter.infra.host_os import Windows
from se_exporter.sidecar.settings import DEFAULT_PORT, RUN_OPTIONS, run_settings

ROOT = Path(__file__).parent.parent.parent
WINDOWS = ROOT / "deploy" / "windows"
PROGRAM_DATA = r"C:\ProgramData"
LOCAL_SERVICE_SID = "S-1-5-19"  # NT AUTHORITY\LocalService
STEPS = ["Assert-Administrator", "Install-Python", "Get-CurrentRelease", "Install-Release", "Set-StateFolderAcl",
         "Switch-Service", "Open-MetricsPort", "Complete-Upgrade"]
SECRET_WORDS = re.compile(r"(?i)password|secret|sharedaccess|connectionstring|accountkey|token|\bkey\b")


def service() -> ET.Element:
    return ET.parse(WINDOWS / "se-exporter.xml").getroot()  # noqa: S314 - our own file from the repository


def expand(text: str) -> str:
    """WinSW's %Name% expansion, with the values of an Azure VM."""
    return text.replace("%ProgramData%", PROGRAM_DATA).replace("%BASE%", r"C:\Program Files\se-exporter")


def seconds(duration: str) -> float:
    """A WinSW duration ("15 sec", "3 min", "1 hour")."""
    number, unit = re.fullmatch(r"\s*(\d+)\s*(sec|secs|min|mins|hour|hours|ms)\s*", duration).groups()
    return int(number) * {"ms": 0.001, "sec": 1, "secs": 1, "min": 60, "mins": 60, "hour": 3600, "hours": 3600}[unit]


def script() -> Node:
    parser = Parser(Language(tree_sitter_powershell.language()))
    return parser.parse((WINDOWS / "install.ps1").read_bytes()).root_node


def nodes(node: Node, kind: str) -> list[Node]:
    found = [node] if node.type == kind else []
    for child in node.children:
        found.extend(nodes(child, kind))
    return found


def text(node: Node) -> str:
    return (node.text or b"").decode()


def test_the_service_starts_the_virtualenvs_python_with_run_and_valid_settings() -> None:
    """The wrapper runs ``<venv>\\Scripts\\python.exe -m se_exporter run``; its arguments and <env> settings are
    accepted by se-exporter's own parser, and the state lands in %ProgramData%\\se-exporter."""
    root = service()
    assert root.findtext("id") == "se-exporter"
    executable = expand(root.findtext("executable") or "")
    assert ntpath.normcase(executable).endswith(ntpath.normcase(r"\venv\Scripts\python.exe"))
    arguments = shlex.split(expand(root.findtext("arguments") or "").replace("\\", "\\\\"))
    assert arguments[:3] == ["-m", "se_exporter", "run"]
    env = {item.get("name", ""): expand(item.get("value", "")) for item in root.findall("env")}
    settings = run_settings(build_parser().parse_args(arguments[2:]), env)
    assert str(settings.state_path) == rf"{PROGRAM_DATA}\se-exporter"  # a Path since settings hold Path types
    assert settings.listen.port == DEFAULT_PORT
    known = {option.env for option in RUN_OPTIONS} | {"PYTHONUTF8"}
    assert set(env) <= known


def test_the_state_path_is_the_windows_default() -> None:
    """The explicit --state-dir is where se-exporter would keep its state on Windows anyway."""
    default = Windows(object(), lambda handler: None, -5, 0x8000, lambda a, b: None).default_state_dir(
        {"ProgramData": PROGRAM_DATA})
    arguments = expand(service().findtext("arguments") or "")
    assert f'--state-dir "{default}"' in arguments
    assert expand(service().findtext("workingdirectory") or "") == default


def test_stopping_is_a_console_control_event_within_the_timeouts() -> None:
    """No stop executable (so WinSW stops with Ctrl+C, which se-exporter treats as SIGTERM); the stop timeout leaves
    the orderly stop the 15 s the systemd unit gives it, and pre-shutdown is on with more time than that."""
    root = service()
    assert root.find("stopexecutable") is None and root.find("stoparguments") is None
    assert root.find("stopargument") is None
    stop = seconds(root.findtext("stoptimeout") or "")
    assert 15 <= stop <= 60
    assert (root.findtext("preshutdown") or "").strip() == "true"
    assert seconds(root.findtext("preshutdownTimeout") or "") > stop


def test_the_service_account_is_localservice_without_a_password() -> None:
    """A least-privilege built-in account; no password anywhere in the file."""
    root = service()
    assert root.findtext("serviceaccount/username") == r"NT AUTHORITY\LocalService"
    assert all(element.tag != "password" for element in root.iter())
    values = [element.text or "" for element in root.iter()] + [v for e in root.iter() for v in e.attrib.values()]
    assert not [value for value in values if SECRET_WORDS.search(value)]


def test_failures_restart_and_logs_roll_beside_the_state() -> None:
    """A crash restarts the service; the wrapper's logs roll by size under the state folder the ACL protects."""
    root = service()
    assert [item.get("action") for item in root.findall("onfailure")][:1] == ["restart"]
    assert (root.findtext("startmode") or "") == "Automatic"
    assert expand(root.findtext("logpath") or "").startswith(rf"{PROGRAM_DATA}\se-exporter")
    log = root.find("log")
    assert log is not None and log.get("mode") == "roll-by-size"


def test_install_script_parses_as_powershell() -> None:
    """The PowerShell grammar finds no syntax error in install.ps1."""
    tree = script()
    assert not tree.has_error, [text(node)[:80] for node in nodes(tree, "ERROR")]


def test_the_parser_would_see_a_broken_script() -> None:
    """The syntax check can fail: an unclosed block is reported."""
    parser = Parser(Language(tree_sitter_powershell.language()))
    assert parser.parse(b"function Install-Service { if ($x) { Write-Output 1 }").root_node.has_error


def test_install_script_parameters_and_no_secrets() -> None:
    """Its parameters are the documented ones, the metrics port defaults to se-exporter's, and nothing in it takes
    or holds a secret (Event Hubs goes through the managed identity)."""
    source = (WINDOWS / "install.ps1").read_text()
    (block,) = [node for node in script().children if node.type == "param_block"]
    parameters = {text(node).split("$")[1].split()[0].rstrip(")") for node in nodes(block, "script_parameter")}
    assert parameters == {"Wheels", "Sha256", "PythonInstaller", "PythonExe", "WinSW", "InstallDir", "StateDir", "Port",
                          "ScrapeFrom", "EventHubNamespace", "EventHubName", "ClientId", "OtlpEndpoint",
                          "MaxScrapeInterval", "HealthTimeout", "Uninstall", "Purge"}
    assert re.search(rf"\[int\] \$Port = {DEFAULT_PORT}\b", source)
    assert not any(SECRET_WORDS.search(name) for name in parameters)
    assert not re.search(r"(?i)SharedAccessKey|ConnectionString|ConvertTo-SecureString|-Password", source)


def _called(node: Node, defined: list[str]) -> list[str]:
    """The script's own functions that ``node`` calls, in order."""
    return [text(command.children[0]) for command in nodes(node, "command")
            if command.children and text(command.children[0]) in defined]


def _defined(tree: Node) -> list[str]:
    return [text(node.child_by_field_name("function_name") or node.children[1])
            for node in nodes(tree, "function_statement")]


def test_install_script_runs_every_step_in_order() -> None:
    """Each step is a function, defined once and called once at the top level, in the order an install or upgrade
    needs; -Uninstall removes and returns before any of them but the administrator check."""
    tree = script()
    defined = _defined(tree)
    top = [node for node in tree.children[-1].children
           if node.type in ("pipeline", "if_statement") and _called(node, defined)]
    steps = [name for node in top if node.type == "pipeline" for name in _called(node, defined)]
    assert steps == STEPS
    (branch,) = [node for node in top if node.type == "if_statement"]
    assert text(branch.children[1]) + text(branch.children[2]) + text(branch.children[3]) == "($Uninstall)"
    assert _called(branch, defined) == ["Remove-Service"] and "return" in text(branch)
    assert top.index(branch) == 1
    assert set(defined) == {*STEPS, "Invoke-Checked", "Write-ServiceConfig", "Remove-Service", "Test-Healthy"}


def _function(name: str) -> Node:
    tree = script()
    (found,) = [node for node in nodes(tree, "function_statement")
                if text(node.child_by_field_name("function_name") or node.children[1]) == name]
    return found


def test_install_refuses_a_wheelhouse_whose_hash_is_not_the_one_given() -> None:
    """Install-Release compares the archive's SHA-256 with -Sha256 before it unpacks or creates anything, and
    builds the new release in a folder of its own (never the running one's)."""
    body = text(_function("Install-Release"))
    checked = body.index("Get-FileHash -Algorithm SHA256 -LiteralPath $Wheels")
    refused = body.index("refused, nothing changed")
    assert checked < refused < body.index("Expand-Archive") < body.index("'-m', 'venv'")
    reused = body.index("if ($release -eq (Get-CurrentRelease)) { return $release }")
    assert reused < body.index("Remove-Item -LiteralPath $venv")
    assert '"releases\\$release"' in body
    assert "--clear" not in (WINDOWS / "install.ps1").read_text()


def test_an_upgrade_that_does_not_answer_is_rolled_back() -> None:
    """Complete-Upgrade removes the other releases only after /healthz answers; otherwise it points the service
    back at the previous release, removes the new one and fails naming both."""
    body = text(_function("Complete-Upgrade"))
    healthy = body.index("if (Test-Healthy)")
    assert body.index("Remove-Item -Recurse -Force") > healthy
    rollback = body.index("Switch-Service -Release $Previous")
    assert rollback > body.index("return", healthy)
    assert "rolled back to $Previous, which is running" in body
    switch = text(_function("Switch-Service"))
    assert switch.index("'stop'") < switch.index("Write-ServiceConfig -Release $Release") < switch.index("'start'")
    config = text(_function("Write-ServiceConfig"))
    assert '$config.service.executable = Join-Path $InstallDir "releases\\$Release\\Scripts\\python.exe"' in config


def test_uninstall_keeps_the_state_folder_unless_purge() -> None:
    """-Uninstall stops and removes the service, its firewall rule and the install folder; the state folder goes
    only with -Purge."""
    body = text(_function("Remove-Service"))
    assert [call.split("'")[1] for call in commands(_function("Remove-Service"))
            if call.startswith("Invoke-Checked $wrapper")] == ["stop", "uninstall"]
    assert "Remove-NetFirewallRule" in body
    assert "Remove-Item -LiteralPath $InstallDir -Recurse -Force" in body
    assert "if ($Purge -and (Test-Path -LiteralPath $StateDir)) { Remove-Item -LiteralPath $StateDir" in body


def commands(tree: Node) -> list[str]:
    return [text(node) for node in nodes(tree, "command")]


def test_install_script_installs_offline_and_locks_down_the_state_folder() -> None:
    """pip installs from the wheelhouse only, every wheel checked against the hash its requirements.txt names (the
    lock's); the state folder loses inherited entries and gets SYSTEM and
    Administrators full control and the service account (LocalService, as in the XML) Modify."""
    source = (WINDOWS / "install.ps1").read_text()
    tree = script()
    assert re.search(r"'-m', 'venv'", source)
    assert re.search(r"'pip', 'install', '--no-index', '--find-links', \$source", source)
    assert re.search(r"'--require-hashes', '-r', \(Join-Path \$source 'requirements.txt'\)", source)
    assert "SetAccessRuleProtection($true, $false)" in source
    for sid in ("S-1-5-18", "S-1-5-32-544", LOCAL_SERVICE_SID):
        assert f"'{sid}'" in source
    assert re.search(r"FileSystemAccessRule \$service, 'Modify'", source)
    assert any(command.startswith("Set-Acl -LiteralPath $StateDir") for command in commands(tree))
    assert service().findtext("serviceaccount/username") == r"NT AUTHORITY\LocalService"


def test_install_script_opens_the_metrics_port_to_the_scrapers_only() -> None:
    """One inbound TCP rule for the metrics port, limited to -ScrapeFrom; the service is installed and started with
    the wrapper and /healthz is awaited."""
    found = commands(script())
    (rule,) = [command for command in found if command.startswith("New-NetFirewallRule")]
    for part in ("-Direction Inbound", "-Action Allow", "-Protocol TCP", "-LocalPort $Port",
                 "-RemoteAddress $ScrapeFrom"):
        assert part in rule
    wrapper_calls = [command for command in commands(_function("Switch-Service"))
                     if command.startswith("Invoke-Checked $wrapper")]
    assert [call.split("'")[1] for call in wrapper_calls] == ["stop", "install", "start"]
    assert any("/healthz" in command for command in found if command.startswith("Invoke-WebRequest"))


def test_install_script_settings_are_real_options() -> None:
    """The variables install.ps1 writes into the service configuration are ones se-exporter reads."""
    source = (WINDOWS / "install.ps1").read_text()
    names = set(re.findall(r"'((?:SE_EXPORTER|OTEL)_[A-Z_]+)'", source))
    assert names and names <= {option.env for option in RUN_OPTIONS} | {"OTEL_EXPORTER_OTLP_ENDPOINT"}


def test_the_windows_runtime_set_is_the_locked_one_without_test_tools() -> None:
    """The Windows wheelhouse installs what requirements/runtime.txt locks for Windows: se-exporter's runtime
    dependencies, what only Windows needs, and none of the test tools."""
    from scripts import lockfile  # noqa: PLC0415 - a script module, imported only here

    names = {pin.name for pin in lockfile.select(lockfile.read(lockfile.RUNTIME), "win-amd64", "3.11")}
    assert {"h11", "prometheus-client", "azure-eventhub", "opentelemetry-sdk"} <= names
    assert not names & {"pytest", "mypy", "ruff", "hypothesis", "tree-sitter", "httpx", "uv"}
