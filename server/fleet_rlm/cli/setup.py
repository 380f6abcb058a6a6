"""``doctor`` and ``config``: what is set up, what is missing and how to fix it."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from typing import Any

from fleet_rlm import config as cfg
from fleet_rlm.cli.common import print_json
from fleet_rlm.errors import UserError


def _field(key: str) -> str:
    name = key.lower().removeprefix("fleet_")
    if name not in cfg.Settings.model_fields:
        raise UserError(f"unknown setting '{key}': `fleet-rlm config list` shows every setting")
    return name


_LABELS = {"dotenv": ".env", "file": "settings.json"}  # how `config list` names the shared sources


def _source(name: str, origins: dict[str, list[str]]) -> str:
    """Where the value in effect comes from (``config.setting_origins``), as `config list` shows it."""
    source = cfg.source_in_effect(origins[name])
    if source == "default" and name in cfg.SECRET_FIELDS:
        return "-"
    return _LABELS.get(source, source)


def _display(settings: cfg.Settings, name: str) -> str:
    value = getattr(settings, name)
    if name in cfg.SECRET_FIELDS:
        return cfg.mask(value.get_secret_value() if value is not None else None)
    if name == "models":
        return json.dumps(cfg.models_shown(settings)) if value else "(not set)"
    if name == "mcp_servers":  # where each server is, never its headers' or environment's values
        shown = {n: s.url if s.type == "http" else " ".join([str(s.command), *s.args]) for n, s in value.items()}
        return json.dumps(shown) if shown else "(not set)"
    if name == "tools":
        return ", ".join(value) if value else "(not set)"
    return "(not set)" if value is None else str(value)


def cmd_config(args: argparse.Namespace) -> int:
    if args.action == "list":
        settings = cfg.load_settings()
        origins = cfg.setting_origins()
        withheld = cfg.withheld_keys(settings)
        values = {name: _display(settings, name) for name in cfg.Settings.model_fields}
        name_width, value_width = max(map(len, values)), max(map(len, values.values()))
        for name, value in values.items():
            note = f"  {withheld[name]}" if name in withheld else ""
            print(f"{name:<{name_width}}  {value:<{value_width}}  [{_source(name, origins)}]{note}")
        return 0
    name = _field(args.key)
    if args.action == "get":
        print(_display(cfg.load_settings(), name))
        return 0
    if args.action == "unset":
        if name in cfg.SECRET_FIELDS:
            removed = cfg.forget_secret(name)
            print(f"{name}: removed from the keyring" if removed else f"{name}: was not in the keyring")
        else:
            cfg.update_user_settings(lambda values: values.pop(name, None))
            print(f"{name}: unset")
        return 0
    value = args.value
    if name in cfg.SECRET_FIELDS:
        usable, backend = cfg.keyring_status()
        if not usable:  # say so before asking for the key
            raise cfg.ConfigError(cfg.NO_KEYRING_HELP.format(backend=backend, env=cfg.env_name(name)))
        if value is None:
            value = getpass.getpass(f"{name} (not echoed): ")
        if not value:
            raise UserError(f"{name}: empty value, nothing stored")
        cfg.save_settings({name: value})  # with the endpoint the key is for
        print(f"{name}: stored in the OS keyring, {cfg.mask(value)}")
        return 0
    if value is None:
        raise UserError(f"give a value: fleet-rlm config set {name} VALUE")
    cfg.save_settings({name: value})
    print(f"{name} = {value}  (saved in {cfg.user_settings_path()})")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from fleet_rlm.core.doctor import doctor_report

    report = asyncio.run(doctor_report(cfg.load_settings(), offline=args.offline))
    if args.json:
        print_json(report)
    else:
        for name, item in report.items():
            mark = "ok " if item["ok"] else "!! "
            print(f"{mark} {name:<8} {item['detail'] if name != 'caps' else _caps_summary(item)}")
            for line in item.get("not_enforced", []):
                print(f"             NOT ENFORCED: {line}")
            if item.get("fix"):
                print(f"             fix: {item['fix']}")
    # Only a model that cannot answer or an unusable sandbox stops runs; the rest degrade with a
    # warning, unless --strict.
    if not report["model"]["ok"] or any(item.get("blocking") for item in report.values()):
        return 1
    missing = report.get("caps", {}).get("not_enforced", [])
    if args.strict and missing:
        print(f"doctor --strict: {len(missing)} sandbox cap(s) not enforced (see above)", file=sys.stderr)
        return 2
    return 0


def _caps_summary(item: dict[str, Any]) -> str:
    enforced = [r["name"] for r in item["caps"] if r["enforced"]]
    return f"enforced: {', '.join(enforced) or 'none'}"
