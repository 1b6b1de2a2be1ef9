"""Readers reach the control plane only through `ControlView`: the plane implements it, and the admin API, apply and
restart use nothing of the plane that the view does not name (checked on their source)."""

from __future__ import annotations

import ast
from pathlib import Path

from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.view import ControlView

CONTROL = Path(__file__).resolve().parents[2] / "llmgw" / "control"
VIEW_NAMES = {name for name in dir(ControlView) if not name.startswith("_")} | set(ControlView.__annotations__)


def plane_attributes(path: Path) -> set[str]:
    """Every `plane.X` and `self.plane.X` attribute name used in `path`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "plane":
                names.add(node.attr)
            elif isinstance(owner, ast.Attribute) and owner.attr == "plane":
                names.add(node.attr)
    return names


def test_the_control_plane_implements_the_view(tmp_path):
    plane = ControlPlane(ControlConfig(repo=str(tmp_path / "repo"), state_dir=tmp_path / "state"))
    assert isinstance(plane, ControlView)


def test_the_admin_api_apply_and_restart_use_only_what_the_view_names():
    for module in ("admin.py", "applying.py", "restarting.py"):
        used = plane_attributes(CONTROL / module)
        assert used, module
        assert used <= VIEW_NAMES, f"{module} reaches into the plane for {sorted(used - VIEW_NAMES)}"


async def test_open_control_plane_yields_the_view_with_its_listeners_bound(settings_repo, tmp_path):
    import trio

    from llmgw.control import open_control_plane
    from llmgw.settings.model import Listener

    config = ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False,
                           admin_listener=Listener("127.0.0.1", 0), agents_listener=Listener("127.0.0.1", 0))
    async with open_control_plane(config) as plane:
        assert isinstance(plane, ControlView)
        assert plane.admin_url.startswith("http://127.0.0.1:") and plane.agents_port > 0
        with trio.fail_after(10):
            while plane.snapshot().settings is None or not plane.snapshot().leadership.leader:
                await trio.sleep(0.05)
        assert plane.status(readings=False)["control_plane"]["admin_url"] == plane.admin_url
        from typing import get_args

        from llmgw.control.effects import Effect
        assert set(get_args(Effect)) <= set(plane.handlers.kinds())  # no kind of effect is dropped unhandled
    assert (tmp_path / "state" / "admin-url").read_text().strip() == plane.admin_url
