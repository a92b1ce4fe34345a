"""Every option of every command has its settings field: an option without one would start the program and then
fail with a ``TypeError`` as soon as its flag is given."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from se_exporter.consume.settings import CONSUME_OPTIONS, ConsumeSettings
from se_exporter.fleet.settings import FLEET_OPTIONS, FleetSettings
from se_exporter.infra.options import Option
from se_exporter.sidecar.settings import RUN_OPTIONS, Settings
from se_exporter.simulator.settings import SIMULATE_OPTIONS, SimulatorSettings

COMMANDS: dict[str, tuple[Sequence[Option], type]] = {
    "run": (RUN_OPTIONS, Settings), "consume": (CONSUME_OPTIONS, ConsumeSettings),
    "fleet": (FLEET_OPTIONS, FleetSettings), "simulate": (SIMULATE_OPTIONS, SimulatorSettings),
}


def without_field(options: Sequence[Option], settings: type) -> list[str]:
    """The flags whose ``dest`` is not a field of ``settings``."""
    fields = {field.name for field in dataclasses.fields(settings)}
    return [option.flag for option in options if option.dest not in fields]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_option_has_its_settings_field(command: str) -> None:
    """Each row of the command's option table names a field of its settings class, which its default builds."""
    options, settings = COMMANDS[command]
    assert without_field(options, settings) == []
    defaults = {field.name: getattr(settings(), field.name) for field in dataclasses.fields(settings)}
    built = settings(**{option.dest: defaults[option.dest] for option in options})  # what resolve() hands it
    assert isinstance(built, settings)


def test_a_row_without_a_field_is_found() -> None:
    """The check itself works: an option row added without its field is named."""
    extra = Option("pager_url", "--pager-url", str, "where to page someone", "URL")
    assert without_field((*RUN_OPTIONS, extra), Settings) == ["--pager-url"]
    with pytest.raises(TypeError):
        Settings(pager_url="http://127.0.0.1:9")  # type: ignore[call-arg]  # what the program would do
