"""Every role's contract (meta/argument_specs.yml) covers every knob of its defaults/, with the same default and a
description; derived values live in vars/ (never both); roles run no inline Python; node modules stay Python 3.7."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "ansible" / "roles"
LIBRARY = REPO / "ansible" / "library"


def roles() -> list[Path]:
    return sorted(p for p in ROLES.iterdir() if (p / "tasks").is_dir())


def knobs(role: Path) -> dict:
    path = role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def options(role: Path) -> dict:
    """Every option of every entry point of the role's argument specs."""
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    out: dict = {}
    for entry in specs.values():
        out.update(entry.get("options") or {})
    return out


def contract_problems(role: Path) -> list[str]:
    problems = []
    if not (role / "meta" / "argument_specs.yml").is_file():
        return [f"{role.name}: no meta/argument_specs.yml"]
    spec = options(role)
    for key, value in knobs(role).items():
        if key not in spec:
            problems.append(f"{role.name}: {key} has no argument spec")
            continue
        if "default" not in spec[key]:
            problems.append(f"{role.name}: {key}'s spec has no default")
        elif spec[key]["default"] != value:
            problems.append(f"{role.name}: {key}'s spec default {spec[key]['default']!r} != defaults {value!r}")
    for key, option in spec.items():
        if not option.get("description"):
            problems.append(f"{role.name}: {key}'s spec has no description")
        if "type" not in option:
            problems.append(f"{role.name}: {key}'s spec has no type")
        if key not in knobs(role) and "default" in option:
            problems.append(f"{role.name}: {key} has a spec default but no defaults/ entry")
    derived = role / "vars" / "main.yml"
    if derived.is_file():
        both = set(yaml.safe_load(derived.read_text()) or {}) & set(knobs(role))
        problems += [f"{role.name}: {key} is both a knob (defaults/) and derived (vars/)" for key in sorted(both)]
    return problems


@pytest.mark.parametrize("role", roles(), ids=lambda p: p.name)
def test_every_knob_has_a_typed_described_spec_with_its_default(role):
    assert contract_problems(role) == []


def test_the_contract_check_fails_on_a_knob_without_a_spec(tmp_path):
    """The walker can fail: a copy of a role with one knob added to defaults/ and not to the spec."""
    import shutil

    copy = tmp_path / "launch"
    shutil.copytree(ROLES / "launch", copy)
    defaults = copy / "defaults" / "main.yml"
    defaults.write_text(defaults.read_text() + "rollout8_job_new_knob: 3\n")
    assert contract_problems(copy) == ["launch: rollout8_job_new_knob has no argument spec"]
    spec = copy / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace("        description: Extra arguments appended", "        summary: x", 1))
    assert any("rollout8_job_args's spec has no description" in p for p in contract_problems(copy))


def test_every_knob_of_a_spec_is_checked_by_the_validate_role():
    """The validate role checks the contracts of the roles it lists before any node: every role is listed."""
    listed = yaml.safe_load((ROLES / "validate" / "vars" / "main.yml").read_text())["rollout8_contract_roles"]
    assert sorted(listed) == sorted(r.name for r in roles())


def test_a_knob_belongs_to_one_role():
    seen: dict[str, str] = {}
    for role in roles():
        for key in knobs(role):
            assert key not in seen, f"{key} is a knob of both {seen[key]} and {role.name}"
            seen[key] = role.name


INLINE_PYTHON = re.compile(r"python[0-9.]*['\"]?\s*,\s*['\"]?-c\b|^\s*-\s*-c\s*$|^\s*import \w+", re.M)


def test_no_inline_python_in_roles():
    """A controller step is one `rollout8 ...` command, a node step a module in ansible/library: no `python -c`."""
    found = []
    for path in sorted(ROLES.rglob("*.yml")):
        text = path.read_text()
        found += [f"{path.relative_to(REPO)}: {m.group(0).strip()}" for m in INLINE_PYTHON.finditer(text)]
        if "_script:" in text and "import " in text:
            found.append(f"{path.relative_to(REPO)}: a script variable")
    assert found == []


def test_the_inline_python_check_sees_one():
    sample = "argv:\n  - \"{{ ansible_playbook_python }}\"\n  - -c\n  - |\n    import json\n"
    assert INLINE_PYTHON.search(sample)
    assert INLINE_PYTHON.search("argv: \"{{ rollout8_exec + [rollout8_bin + '/python', '-c', script] }}\"")


@pytest.mark.parametrize("module", sorted(LIBRARY.glob("*.py")), ids=lambda p: p.name)
def test_node_modules_parse_as_python_37(module):
    """ansible/library runs on the node's own Python: its syntax must be Python 3.7's."""
    ast.parse(module.read_text(), str(module), feature_version=(3, 7))


def test_every_ansible_yaml_file_parses():
    """A task name with an unquoted ': ' is a YAML error that Ansible reports only when it loads the file, i.e. in
    the middle of a play on a cluster: every playbook, role and inventory YAML must load here."""
    broken = []
    for path in sorted((REPO / "ansible").rglob("*.yml")):
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            broken.append(f"{path.relative_to(REPO)}: {str(exc).splitlines()[0]}")
    assert broken == []


JINJA_STATEMENT = re.compile(r"\{%-?\s*(\w+)")


def jinja_statements(text: str) -> list[str]:
    """The Jinja statements ({% for %}, {% set %}, {% if %}, ...) a YAML file's templates hold."""
    return JINJA_STATEMENT.findall(text)


def test_no_jinja_program_in_any_task_or_vars_file():
    """Tasks say what, Python says how: a rule (a loop over hosts, a per-host error list, a closest-name search) is a
    filter in ansible/plugins/filter with a plain pytest test; YAML keeps task order, module arguments, a `when:`
    with one condition or a call, messages. 162 Jinja statements in 8 files before they moved; none now."""
    found = {str(path.relative_to(REPO)): len(jinja_statements(path.read_text()))
             for path in sorted((REPO / "ansible").rglob("*.yml"))}
    assert {path: n for path, n in found.items() if n} == {}


def test_the_jinja_program_check_sees_one():
    sample = "msg: >-\n  {%- set out = [] -%}\n  {% for h in rollout8_nodes %}{{ h }}{% endfor %}\n"
    assert jinja_statements(sample) == ["set", "for", "endfor"]
    assert jinja_statements("msg: \"{{ hostvars | rollout8_dead_hosts(rollout8_nodes) }}\"\n") == []


def test_ansibles_temporary_files_on_the_nodes_are_never_under_the_login_users_home():
    """Homes are often on root-squashed NFS: root (become) cannot read what the login user wrote there. Ansible's
    own reading of ansible.cfg (ansible-config) must put the remote temporary directory under /tmp."""
    out = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-config"), "dump", "--only-changed", "-t", "shell"],
                         cwd=REPO / "ansible", capture_output=True, text=True, timeout=60, check=True).stdout
    [line] = [line for line in out.splitlines() if line.lstrip().startswith("remote_tmp")]
    value = line.split("=", 1)[1].strip()
    assert value.startswith("/tmp/") and "~" not in value and "HOME" not in value, line
