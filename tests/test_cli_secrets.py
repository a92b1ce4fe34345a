"""What a command prints itself never shows a secret given in a flag or a variable: the one-line start-up error,
argparse's error, the demo's banner and a crash; every variant in-process, and through the real process' stderr
(or stdout, for the banner) with every program."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from se_exporter.cli import main
from tests.support.child_logs import attach
from tests.support.helpers import free_port, stop_process, wait_until

# Two halves no message has by chance: a password with a character between them (unencoded, as people paste them)
# must lose both, wherever a URL parser would cut it.
HALVES = ("Kq7ZrTx", "Wm3XpVb")
PASSWORDS = [HALVES[0] + HALVES[1], *(HALVES[0] + char + HALVES[1] for char in "@/?#' :")]
SIG = "U2lnbmF0dXJlT2ZTYXM%3D"
KEY = "S2V5T2ZBSHViVGhhdE11c3ROb3RTaG93"
HUB = f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey={KEY};EntityPath=h"
STORE = "UseDevelopmentStorage=true"


def otlp_variants(password: str) -> list[str]:
    """The ways an OTLP endpoint holding user:password@ is refused: each printed the password."""
    user = f"collector:{password}@"
    return [f"http://{user}127.0.0.1:99999",  # a port out of range
            f"http://{user}127.0.0.1:port",  # a port that is not a number
            f"http://{user}127.0.0.1:4318/?tenant=a",  # a query
            f"http://{user}127.0.0.1:4318/#traces",  # a fragment
            f"ftp://{user}127.0.0.1:4318",  # another scheme
            f"grpc://{user}127.0.0.1:4317",  # another scheme, as gRPC users write it
            f"http://{user}"]  # no host


VARIANTS = otlp_variants(PASSWORDS[0])


def shown(text: str) -> bool:
    """Whether any part of a secret is in ``text``."""
    return any(secret in text for secret in (*HALVES, SIG.split("%", 1)[0], KEY))


def refused(argv: list[str], env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> str:
    """The command run in this process must stop with exit 2 and one line on stderr: that line."""
    try:
        code = main(argv, env=env)
    except SystemExit as exited:  # argparse's own errors
        code = exited.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert (code, out, err.count("\n")) == (2, "", 1), err
    assert err.startswith("se-exporter"), err
    return err


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_a_refused_otlp_endpoint_never_shows_its_password(password: str, variant: int,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT with user:password@ refused for its port, a query, a fragment, its scheme or a
    missing host, whatever the password holds: the line names the variable, and no part of the password."""
    err = refused(["run"], {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_variants(password)[variant]}, capsys)
    assert err.startswith("se-exporter: error: OTEL_EXPORTER_OTLP_ENDPOINT: ")
    assert not shown(err), err


@pytest.mark.parametrize("given", ["--otel-endpoint", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                                   "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"])
@pytest.mark.parametrize("endpoint", VARIANTS)
def test_every_way_to_give_the_otlp_endpoint_hides_its_password(given: str, endpoint: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The flag and the signal-specific variables are refused as the general variable is, with the user and host
    shown and the password redacted."""
    argv, env = (["run", given, endpoint], {}) if given.startswith("--") else (["run"], {given: endpoint})
    err = refused(argv, env, capsys)
    assert f"error: {given}: " in err and not shown(err), err
    assert "collector:<redacted>@" in err or "character" in err


SLASHED = HALVES[0] + "/" + HALVES[1]
OTHER_SECRETS = [
    # a SAS token in the storage account URL (the managed identity needs none)
    (["fleet", "--eventhub-connection-string", HUB, "--checkpoint-account-url",
      f"https://acct.blob.core.windows.net/?sv=2022-11-02&sp=rl&sig={SIG}"], {}, "--checkpoint-account-url"),
    (["fleet", "--eventhub-connection-string", HUB, "--checkpoint-account-url",
      f"https://u:{SLASHED}@acct.blob.core.windows.net"], {}, "--checkpoint-account-url"),
    (["fleet", "--eventhub-connection-string", HUB, "--checkpoint-connection-string",
      f"BlobEndpoint=https://u:{SLASHED}@acct.blob.core.windows.net;SharedAccessSignature=sv=1&sig={SIG}"], {},
     "--checkpoint-connection-string"),
    # a password in an AMQP endpoint, or a connection string pasted where a namespace goes
    (["consume", "--eventhub-connection-string", HUB, "--eventhub-endpoint", f"sb://u:{SLASHED}@10.0.0.1:99999"], {},
     "--eventhub-endpoint"),
    (["run", "--eventhub-namespace", HUB], {}, "--eventhub-namespace"),
    (["fleet", "--eventhub-namespace", HUB, "--checkpoint-connection-string", STORE], {}, "--eventhub-namespace"),
    (["simulate", "--platform-eventhub-namespace", HUB], {}, "--platform-eventhub-namespace"),
    (["simulate"], {"SE_EXPORTER_SIMULATOR_PLATFORM_EVENTHUB_CONNECTION_STRING":
                    f"Endpoint=sb://u:{SLASHED}@ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey={KEY}"},
     "SE_EXPORTER_SIMULATOR_PLATFORM_EVENTHUB_CONNECTION_STRING"),
    # a flag the command does not take, or an abbreviation argparse cannot resolve: argparse repeats the value
    (["consume", "--eventhub-connection-string", HUB, "--otel-endpoint", VARIANTS[2]], {}, "unrecognized"),
    (["fleet", "--otel-endpoint", VARIANTS[2]], {}, "unrecognized"),
    (["simulate", f"--otel-endpoint={VARIANTS[2]}"], {}, "unrecognized"),
    (["run", f"--otel={VARIANTS[2]}"], {}, "ambiguous option"),
]


@pytest.mark.parametrize(("argv", "env", "names"), OTHER_SECRETS,
                         ids=[f"{argv[0]}-{n}" for n, (argv, _, _) in enumerate(OTHER_SECRETS)])
def test_no_program_repeats_a_secret_in_a_refused_value(argv: list[str], env: dict[str, str], names: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """run, fleet, consume and simulate: a SAS signature, a URL's password or a SharedAccessKey in a refused value
    (or in an argument argparse refuses) is redacted from the one line; the line still names what to fix."""
    err = refused(argv, env, capsys)
    assert names in err and not shown(err), err
    assert "<redacted>" in err or "BlobEndpoint" in err  # repeated, redacted; the BlobEndpoint is not repeated


def clean_env(**extra: str) -> dict[str, str]:
    """This process' environment without any SE_EXPORTER_ or OTEL_ setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SE_EXPORTER_", "OTEL_"))}
    return {**env, **extra}


PROCESSES = [
    *((["run"], {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}) for endpoint in VARIANTS),
    (OTHER_SECRETS[0][0], {}),  # fleet: the SAS token
    (OTHER_SECRETS[3][0], {}),  # consume: the endpoint's password
    (["simulate"], OTHER_SECRETS[7][1]),  # simulate: the Endpoint's password in a connection string
]


@pytest.mark.parametrize(("argv", "env"), PROCESSES, ids=[f"{argv[0]}-{n}" for n, (argv, _) in enumerate(PROCESSES)])
def test_the_real_process_stderr_holds_no_secret(argv: list[str], env: dict[str, str]) -> None:
    """``python -m se_exporter`` as a shell or an init system runs it, for every program: exit 2, one line on
    stderr with the secret redacted, nothing on stdout."""
    done = subprocess.run([sys.executable, "-m", "se_exporter", *argv], capture_output=True, text=True, timeout=60,
                          env=clean_env(**env), check=False)
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    assert done.stderr.startswith("se-exporter: error: ") and "<redacted>" in done.stderr, done.stderr
    assert not shown(done.stderr), done.stderr


def test_the_demo_banner_shows_the_otlp_endpoint_without_its_password(tmp_path: Path) -> None:
    """``run --simulate`` with OTEL_EXPORTER_OTLP_ENDPOINT holding user:password@ (a collector that is down): the
    banner names the endpoint with the password redacted, and neither stdout nor stderr holds it."""
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    endpoint = f"http://collector:{PASSWORDS[0]}@127.0.0.1:{free_port()}"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "se_exporter", "run", "--simulate", "--speed", "50", "--listen", "127.0.0.1:0",
             "--state-dir", str(tmp_path / "state")], stdout=out, stderr=err,
            env=clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="50"))
        attach(f"run --simulate (pid {process.pid})", stderr, lambda: process.poll() is None)
        try:
            wait_until(lambda: process.poll() is not None or "Log lines follow" in stdout.read_text(), timeout=30,
                       what="the banner")
        finally:
            code = stop_process(process)
    banner, log = stdout.read_text(), stderr.read_text()
    assert code == 0, log
    assert f"  Spans           OTLP to http://collector:<redacted>@127.0.0.1:{endpoint.rsplit(':', 1)[1]}" in banner
    assert not shown(banner) and not shown(log), banner + log


CRASH = f"""
import sys
from se_exporter import cli

def crash(settings):
    raise RuntimeError("collector http://collector:{PASSWORDS[0]}@127.0.0.1:4318 refused SharedAccessKey={KEY}")

cli.run = crash  # a defect in the command, as the process meets it: raised in the main thread
sys.exit(cli.main(["run", "--imds-url", "http://127.0.0.1:9"]))
"""


def test_a_crash_is_reported_through_the_redacting_log() -> None:
    """An exception no command handles, raised in the main thread: exit 1 and its traceback in the log format,
    the password and the key redacted (Python's own hook, which printed them, never sees it)."""
    done = subprocess.run([sys.executable, "-c", CRASH], capture_output=True, text=True, timeout=60,
                          env=clean_env(), check=False)
    assert done.returncode == 1, done.stderr
    assert "critical se-exporter crashed: collector http://collector:<redacted>@127.0.0.1:4318" in done.stderr
    assert "Traceback" in done.stderr and not shown(done.stderr), done.stderr
