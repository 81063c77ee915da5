"""docs/broker.md's table of APIs is what ApiVersions advertises, and every API module says what it leaves out."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import sparkeos.broker.apis  # registers every API module
from sparkeos.broker.dispatch import APIS

DOC = Path(__file__).resolve().parents[2] / "docs" / "broker.md"
ROW = re.compile(r"^\| (\w+) \| (\d+) \| (\d+)–(\d+) \|", re.MULTILINE)


def test_the_documented_table_is_the_advertised_one() -> None:
    documented = {int(key): (name, int(low), int(high)) for name, key, low, high in ROW.findall(DOC.read_text())}
    advertised = {
        key: (api.request.__name__.removesuffix("Request"), api.min_version, api.max_version)
        for key, api in APIS.items()
    }
    assert documented == advertised


def test_each_handler_is_named_for_its_api_and_its_module_says_what_it_leaves_out() -> None:
    for api in APIS.values():
        module = importlib.import_module(api.handler.__module__)
        assert api.handler.__name__ == f"handle_{module.__name__.rsplit('.', 1)[1]}"
        assert "\nLeaves out:\n- " in (module.__doc__ or ""), module.__name__


def test_the_apis_package_holds_only_handler_modules() -> None:
    package = Path(sparkeos.broker.apis.__file__).parent
    modules = {path.stem for path in package.glob("*.py")} - {"__init__"}
    assert modules == {api.handler.__module__.rsplit(".", 1)[1] for api in APIS.values()}
