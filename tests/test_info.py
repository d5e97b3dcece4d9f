"""``python -m mujou info``'s engine line (observe.info): it says where the engine was loaded from."""

from __future__ import annotations

import pytest

from mujou import _info
from mujou._engine import _update
from tests._compiled import compiled


@pytest.mark.rule("observe.info")
def test_compiled_engine_says_where_the_update_path_was_loaded_from() -> None:
    assert _info.compiled_engine() is compiled(_update)
    info = _info.machine_info()
    assert info["compiled_engine"] is compiled(_update)


@pytest.mark.rule("observe.info")
@pytest.mark.parametrize(("built", "line"), [(True, "compiled with mypyc"), (False, "pure Python")])
def test_the_text_names_the_engines_build(built: bool, line: str) -> None:
    info = {**_info.machine_info(), "compiled_engine": built}
    engine = [row for row in _info.render(info).splitlines() if row.startswith("engine ")]
    assert engine and line in engine[0], _info.render(info)
